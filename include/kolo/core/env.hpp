// kolo/core/env.hpp — reading configuration from the environment, with errors that name the
// variable and the value (`KOLO_RANK=abc is not an integer`), never a crash or a silent default.
#pragma once

#include <charconv>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "kolo/core/error.hpp"

namespace kolo {

// Where variables come from: the process environment by default, a map in tests.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

inline EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (!v) return std::nullopt;
    return std::string(v);
  };
}

inline long long parse_env_int(std::string_view name, std::string_view value) {
  long long out = 0;
  auto trimmed = value;
  while (!trimmed.empty() && trimmed.front() == ' ') trimmed.remove_prefix(1);
  while (!trimmed.empty() && trimmed.back() == ' ') trimmed.remove_suffix(1);
  auto [ptr, ec] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), out);
  if (trimmed.empty() || ec != std::errc() || ptr != trimmed.data() + trimmed.size()) {
    throw ConfigError(std::string(name) + "=" + std::string(value) + " is not an integer");
  }
  return out;
}

inline double parse_env_double(std::string_view name, std::string_view value) {
  std::string v(value);
  char* end = nullptr;
  const double out = std::strtod(v.c_str(), &end);
  if (v.empty() || end != v.c_str() + v.size()) {
    throw ConfigError(std::string(name) + "=" + v + " is not a number");
  }
  return out;
}

// An optional numeric variable; `min`/`max` bound the accepted range.
inline std::optional<double> env_double(const EnvLookup& env, const std::string& name, double min,
                                        double max) {
  auto v = env(name);
  if (!v) return std::nullopt;
  const double d = parse_env_double(name, *v);
  if (!(d >= min && d <= max)) {
    throw ConfigError(name + "=" + *v + " is out of range [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return d;
}

inline std::optional<long long> env_int(const EnvLookup& env, const std::string& name,
                                        long long min, long long max) {
  auto v = env(name);
  if (!v) return std::nullopt;
  const long long d = parse_env_int(name, *v);
  if (d < min || d > max) {
    throw ConfigError(name + "=" + *v + " is out of range [" + std::to_string(min) + ", " +
                      std::to_string(max) + "]");
  }
  return d;
}

// KOLO_LOG_LEVEL: off, error, warning (or warn), info, debug, in any case; unset or empty means
// the default (warning). Only `debug` changes anything today (the store logs the connections it
// refuses), but a misspelt level is an error rather than silently ignored.
enum class LogLevel { off, error, warning, info, debug };

inline LogLevel log_level_from_env(const EnvLookup& env = process_env()) {
  const auto v = env("KOLO_LOG_LEVEL");
  if (!v || v->empty()) return LogLevel::warning;
  std::string l;
  for (char c : *v) l.push_back(c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c);
  if (l == "off" || l == "none") return LogLevel::off;
  if (l == "error") return LogLevel::error;
  if (l == "warning" || l == "warn") return LogLevel::warning;
  if (l == "info") return LogLevel::info;
  if (l == "debug") return LogLevel::debug;
  throw ConfigError("KOLO_LOG_LEVEL=" + *v + " is not one of off, error, warning, info, debug");
}

}  // namespace kolo
