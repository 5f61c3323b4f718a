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

// Surrounding spaces are ignored by both numeric parsers alike; anything else that is not the
// number (a unit, a second value, hex) is an error.
inline std::string_view trim_spaces(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  return v;
}

inline long long parse_env_int(std::string_view name, std::string_view value) {
  long long out = 0;
  const auto trimmed = trim_spaces(value);
  auto [ptr, ec] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), out);
  if (trimmed.empty() || ec != std::errc() || ptr != trimmed.data() + trimmed.size()) {
    throw ConfigError(std::string(name) + "=" + std::string(value) + " is not an integer");
  }
  return out;
}

inline double parse_env_double(std::string_view name, std::string_view value) {
  const std::string v(trim_spaces(value));
  char* end = nullptr;
  const double out = std::strtod(v.c_str(), &end);
  // strtod would skip leading white space other than ' ' (tabs, newlines): refuse it.
  if (v.empty() || end != v.c_str() + v.size() || v.front() == '\t' || v.front() == '\n') {
    throw ConfigError(std::string(name) + "=" + std::string(value) + " is not a number");
  }
  return out;
}

}  // namespace kolo
