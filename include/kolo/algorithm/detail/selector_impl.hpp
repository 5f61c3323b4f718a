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
#include <limits>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "kolo/algorithm/allreduce_double_tree.hpp"
#include "kolo/algorithm/selector.hpp"
#include "kolo/core/compiled_core.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

// ---------------------------------------------------------------- size rules (KOLO_<COLLECTIVE>)

namespace detail {

KOLO_IMPL_INLINE std::string size_bound_text(std::size_t v) {
  return v == kSizeRuleMax ? std::string("max") : std::to_string(v);
}

KOLO_IMPL_INLINE std::string size_range_text(std::size_t lo, std::size_t hi) {
  return size_bound_text(lo) + "-" + size_bound_text(hi);
}

KOLO_IMPL_INLINE std::size_t parse_size_bound(const std::string& where, std::string_view rule,
                                              std::string_view text) {
  const std::string t = lower(trim(text));
  auto bad = [&](const std::string& why) {
    return ConfigError(where + "bad range in rule '" + std::string(rule) + "': " + why);
  };
  if (t == "max") return kSizeRuleMax;
  if (t.empty()) throw bad("a bound is missing");
  std::size_t i = 0;
  unsigned long long v = 0;
  while (i < t.size() && t[i] >= '0' && t[i] <= '9') {
    const unsigned d = static_cast<unsigned>(t[i] - '0');
    if (v > (std::numeric_limits<unsigned long long>::max() - d) / 10) throw bad("too large");
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) throw bad("'" + std::string(trim(text)) + "' is not a byte count");
  unsigned shift = 0;
  const std::string suffix = t.substr(i);
  if (suffix == "k" || suffix == "kb" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mb" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gb" || suffix == "gib") {
    shift = 30;
  } else if (!suffix.empty()) {
    throw bad("'" + std::string(trim(text)) + "' is not a byte count (suffixes: K, M, G)");
  }
  if (shift && v > (std::numeric_limits<unsigned long long>::max() >> shift))
    throw bad("too large");
  return static_cast<std::size_t>(v << shift);
}

KOLO_IMPL_INLINE SizeRuleSpan parse_size_rule(const std::string& where, std::string_view item,
                                              RuleNameParser parse_name) {
  const auto colon = item.find(':');
  SizeRuleSpan r{};
  if (colon == std::string_view::npos) {  // a bare name: NAME:0-max
    try {
      r.algo = parse_name(item, "'" + std::string(item) + "'");
    } catch (const ConfigError& e) {
      throw ConfigError(
          where + "rule '" + std::string(item) +
          "' is neither an algorithm name nor NAME:LO-HI (e.g. ring:0-max): " + e.what());
    }
    r.lo = 0;
    r.hi = kSizeRuleMax;
    return r;
  }
  const std::string_view name = item.substr(0, colon);
  const std::string_view range = trim(item.substr(colon + 1));
  try {
    r.algo = parse_name(name, "rule '" + std::string(item) + "'");
  } catch (const ConfigError& e) {
    throw ConfigError(where + e.what());
  }
  const auto dash = range.find('-');
  if (dash == std::string_view::npos) {
    throw ConfigError(where + "bad range in rule '" + std::string(item) +
                      "': expected LO-HI, e.g. 0-65536 or 65537-max");
  }
  r.lo = parse_size_bound(where, item, range.substr(0, dash));
  r.hi = parse_size_bound(where, item, range.substr(dash + 1));
  if (r.lo == kSizeRuleMax) {
    throw ConfigError(where + "bad range in rule '" + std::string(item) +
                      "': the lower bound cannot be max");
  }
  if (r.lo > r.hi) {
    throw ConfigError(where + "bad range in rule '" + std::string(item) +
                      "': " + std::to_string(r.lo) + " is above " + size_bound_text(r.hi));
  }
  return r;
}

KOLO_IMPL_INLINE std::vector<SizeRuleSpan> parse_size_rules(std::string_view var,
                                                            std::string_view spec,
                                                            RuleNameParser parse_name) {
  const std::string where = std::string(var) + "=\"" + std::string(spec) + "\": ";
  std::vector<SizeRuleSpan> rules;
  if (trim(spec).empty()) throw ConfigError(where + "is empty");
  std::string_view rest = spec;
  std::string_view bare;  // a rule that is a bare name (all sizes), if any
  while (true) {
    const auto semi = rest.find(';');
    const std::string_view item = trim(rest.substr(0, semi));
    if (!item.empty()) {
      rules.push_back(parse_size_rule(where, item, parse_name));
      if (item.find(':') == std::string_view::npos) bare = item;
    } else if (semi != std::string_view::npos && semi + 1 < rest.size()) {
      throw ConfigError(where + "empty rule between ';'");
    }
    if (!bare.empty() && rules.size() > 1) {
      throw ConfigError(where + "rule '" + std::string(bare) + "' is a bare name (" +
                        std::string(bare) +
                        ":0-max, every size) and cannot be combined with other rules");
    }
    if (semi == std::string_view::npos) break;
    rest.remove_prefix(semi + 1);
  }
  std::sort(rules.begin(), rules.end(),
            [](const SizeRuleSpan& a, const SizeRuleSpan& b) { return a.lo < b.lo; });
  std::size_t next = 0;  // the first byte count not covered yet
  bool done = false;
  for (std::size_t i = 0; i < rules.size(); ++i) {
    const SizeRuleSpan& r = rules[i];
    if (done || (i > 0 && r.lo < next)) {
      const SizeRuleSpan& p = rules[i - 1];
      throw ConfigError(where + "ranges " + size_range_text(p.lo, p.hi) + " and " +
                        size_range_text(r.lo, r.hi) + " overlap");
    }
    if (r.lo > next) {
      throw ConfigError(where + "does not cover sizes " + std::to_string(next) + "-" +
                        std::to_string(r.lo - 1) + " (rules must cover 0-max)");
    }
    if (r.hi == kSizeRuleMax) {
      done = true;
    } else {
      next = r.hi + 1;
    }
  }
  if (!done) {
    throw ConfigError(where + "does not cover sizes " + std::to_string(next) +
                      "-max (rules must cover 0-max)");
  }
  return rules;
}

}  // namespace detail

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

KOLO_IMPL_INLINE std::size_t Selector::tree_segment(std::size_t half_bytes, bool cross) const {
  const LinkCost l = cross ? shape_.inter : shape_.flat;
  return double_tree_segment(half_bytes, cross ? shape_.hosts : shape_.size,
                             l.alpha / std::max(l.beta, 1e-15), segment_bytes_);
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
