// tests/common/config_table.hpp — the one list of every KOLO_* variable: each layer's own list
// (declared next to its code; kolo/core/config.hpp names the files), in documentation order.
// docs/environment.md is generated from it (tests/docs/env_doc.cpp), the bad-value sweep and
// the choice check walk it (tests/unit/test_env_sweep.cpp, test_config_choices.cpp), and the
// source scan (tests/docs/check_env_names.py) takes its names.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "../../backends/local/launcher_config.hpp"
#include "../../backends/torch/build_config.hpp"
#include "../../backends/torch/csrc/torch_config.hpp"
#include "kolo/core/config.hpp"
#include "kolo/spark/spark_config.hpp"

namespace kolo::config {

// Every layer's list, in documentation order.
inline const std::vector<std::span<const Var* const>>& layers() {
  static const std::vector<std::span<const Var* const>> all = {
      kCoreVars,        kTransportVars, kSelectionVars, kEngineVars,
      kCompressionVars, kGpuVars,       kMpiVars,       kTorchVars,
      kSparkDataVars,   kLauncherVars,  kBuildVars,     kSparkInternalVars};
  return all;
}

// Every variable, in documentation order.
inline const std::vector<const Var*>& all_vars() {
  static const std::vector<const Var*> all = [] {
    std::vector<const Var*> out;
    for (auto layer : layers()) out.insert(out.end(), layer.begin(), layer.end());
    return out;
  }();
  return all;
}

// The declaration of `name` among every variable, or nullptr.
inline const Var* find_any(std::string_view name) {
  return find_in(all_vars(), name);
}

}  // namespace kolo::config
