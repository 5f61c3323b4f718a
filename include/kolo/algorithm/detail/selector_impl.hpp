// kolo/algorithm/detail/selector_impl.hpp — the Selector's and Tuning's non-template members
// (algorithm/selector.hpp): construction, the tuning file's format, overrides, descriptions.
//
// Cold, and they instantiate the per-collective tables and rule parsers: header-only,
// selector.hpp includes this file; with the compiled core only the library does
// (core/compiled_core.hpp, KOLO_IMPL_INLINE).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <tuple>

#include "kolo/algorithm/selector.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

KOLO_IMPL_INLINE std::string Tuning::to_text() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "# kolo tuning: alpha in microseconds, beta and gamma in nanoseconds per byte\n"
                "shm_alpha_us %.4f\nshm_beta_ns %.5f\ntcp_alpha_us %.4f\ntcp_beta_ns %.5f\n"
                "gamma_ns %.5f\ncores %d\n",
                shm.alpha * 1e6, shm.beta * 1e9, tcp.alpha * 1e6, tcp.beta * 1e9, gamma * 1e9,
                cores);
  return buf;
}

KOLO_IMPL_INLINE Tuning Tuning::from_text(std::string_view text, const std::string& where) {
  Tuning t;
  std::size_t line_no = 0;
  while (!text.empty()) {
    const auto nl = text.find('\n');
    std::string_view line = detail::trim(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    const auto sp = line.find_first_of(" \t=");
    const std::string key(line.substr(0, sp));
    const std::string val(sp == std::string_view::npos ? "" : detail::trim(line.substr(sp + 1)));
    const std::string at = where + ": line " + std::to_string(line_no) + ": ";
    char* end = nullptr;
    const double v = std::strtod(val.c_str(), &end);
    if (val.empty() || end != val.c_str() + val.size() || !(v >= 0) || !std::isfinite(v)) {
      throw ConfigError(at + "'" + std::string(line) + "' needs a non-negative number");
    }
    if (key == "shm_alpha_us") {
      t.shm.alpha = v * 1e-6;
    } else if (key == "shm_beta_ns") {
      t.shm.beta = v * 1e-9;
    } else if (key == "tcp_alpha_us") {
      t.tcp.alpha = v * 1e-6;
    } else if (key == "tcp_beta_ns") {
      t.tcp.beta = v * 1e-9;
    } else if (key == "gamma_ns") {
      t.gamma = v * 1e-9;
    } else if (key == "cores") {
      if (v != std::floor(v) || v > 1e6) {
        throw ConfigError(at + "'" + std::string(line) + "' needs a whole number of cores");
      }
      t.cores = static_cast<int>(v);
    } else {
      throw ConfigError(at + "unknown key '" + key +
                        "' (expected shm_alpha_us, shm_beta_ns, tcp_alpha_us, tcp_beta_ns, "
                        "gamma_ns, cores)");
    }
  }
  return t;
}

KOLO_IMPL_INLINE Selector::Selector(Tuning tuning, SelectionShape shape, std::size_t segment_bytes)
    : tuning_(tuning), shape_(shape), segment_bytes_(segment_bytes) {
  // Ranks on the busiest host: all of them on one host.
  const int per_host = shape_.hosts <= 1 ? shape_.size : shape_.local_size;
  const int cores = tuning_.cores;
  rho_ = cores > 0 ? std::max(1.0, static_cast<double>(per_host) / cores) : 1.0;
  // Host-local β (the flat link when the job is on one host) and γ share the cores.
  eff_flat_ = shape_.flat;
  if (shape_.hosts <= 1) eff_flat_.beta *= rho_;
  eff_gamma_ = tuning_.gamma * rho_;
  std::apply([](auto&... t) { (t.snapshot(), ...); }, tables_);
}

KOLO_IMPL_INLINE void Selector::set_allreduce_rules(std::string_view spec) {
  set_rules<AllreduceAlgorithm>(spec);
}

KOLO_IMPL_INLINE void Selector::set_broadcast_rules(std::string_view spec) {
  set_rules<BroadcastAlgorithm>(spec);
}

KOLO_IMPL_INLINE void Selector::clear_overrides() {
  std::apply([](auto&... t) { ((t.rules = {}), ...); }, tables_);
}

KOLO_IMPL_INLINE std::string Selector::describe() const {
  char buf[320];
  std::snprintf(buf, sizeof(buf),
                "tuning %s: shm a=%.2fus b=%.3fns/B, tcp a=%.2fus b=%.3fns/B, g=%.3fns/B, "
                "%d cores (%.2g ranks per core); ",
                Tuning::source_name(tuning_.source), tuning_.shm.alpha * 1e6,
                tuning_.shm.beta * 1e9, tuning_.tcp.alpha * 1e6, tuning_.tcp.beta * 1e9,
                tuning_.gamma * 1e9, tuning_.cores, rho_);
  std::string s = std::string(buf) + "allreduce " + rules<AllreduceAlgorithm>().describe() +
                  ", broadcast " + rules<BroadcastAlgorithm>().describe();
  auto more = [&](const char* name, const auto& r) {
    if (!r.empty()) s += std::string(", ") + name + " " + r.describe();
  };
  more("allgather", rules<AllgatherAlgorithm>());
  more("reduce_scatter", rules<ReduceScatterAlgorithm>());
  more("alltoall", rules<AlltoallAlgorithm>());
  return s;
}

}  // namespace kolo
