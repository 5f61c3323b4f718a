// kolo/core/config.hpp — the library's KOLO_* variables: every layer's declarations, included
// together for code that reads several layers' variables, and find_var over them.
//
// Each layer declares its own variables next to its code, with a list of them:
//   core/core_config.hpp                 the launcher contract and KOLO_LOG_LEVEL (kCoreVars)
//   transport/transport_config.hpp       route policy, mesh, GPU, MPI (kTransportVars, ...)
//   algorithm/selection_config.hpp       algorithm selection (kSelectionVars)
//   engine/engine_config.hpp             the Engine (kEngineVars)
//   compression/compression_config.hpp   KOLO_COMPRESSION (kCompressionVars)
// and the backends theirs: backends/torch/csrc/torch_config.hpp, backends/torch/build_config.hpp,
// backends/local/launcher_config.hpp, backends/spark/include/kolo/spark/spark_config.hpp.
// How a variable is declared (Var, Choice) and read (get_int, get_choice<E>, ...):
// core/config_var.hpp. One list of every layer's list, tests/common/config_table.hpp, feeds
// docs/environment.md (tests/docs/env_doc.cpp; CTest docs/environment fails when the page and
// the declarations disagree), the bad-value sweep (tests/unit/test_env_sweep.cpp), the choice
// check (tests/unit/test_config_choices.cpp) and the source scan (CTest docs/env_names: code
// may name no KOLO_* variable that is not declared).
//
// To add a variable: one `Var` in its layer's file and one entry in that file's list; a new
// layer's list goes into tests/common/config_table.hpp. Then regenerate docs/environment.md
// (`build/tests/kolo_env_doc > docs/environment.md`).
#pragma once

#include <span>
#include <string_view>

#include "kolo/algorithm/selection_config.hpp"
#include "kolo/compression/compression_config.hpp"
#include "kolo/core/config_var.hpp"
#include "kolo/core/core_config.hpp"
#include "kolo/engine/engine_config.hpp"
#include "kolo/transport/transport_config.hpp"

namespace kolo::config {

// The library's declaration named `name` (any layer above), or nullptr.
inline const Var* find_var(std::string_view name) {
  for (std::span<const Var* const> layer :
       {std::span<const Var* const>(kCoreVars), std::span<const Var* const>(kTransportVars),
        std::span<const Var* const>(kSelectionVars), std::span<const Var* const>(kEngineVars),
        std::span<const Var* const>(kCompressionVars), std::span<const Var* const>(kGpuVars),
        std::span<const Var* const>(kMpiVars)}) {
    if (const Var* v = find_in(layer, name)) return v;
  }
  return nullptr;
}

}  // namespace kolo::config
