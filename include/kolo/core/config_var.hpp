// kolo/core/config_var.hpp — how a KOLO_* variable is declared (Var, and Choice for the values
// of a choice), and the readers that take a declaration, never a bare name.
//
// Each layer declares its own variables next to its code (core/core_config.hpp,
// transport/transport_config.hpp, algorithm/selection_config.hpp,
// compression/compression_config.hpp, engine/engine_config.hpp, and the backends' own
// *_config.hpp), each with a list of them in documentation order; one list of those lists
// (tests/common/config_table.hpp) feeds the generated docs/environment.md, the bad-value sweep
// and the source scan of names.
//
// A choice is read as an enum: its values are declared with the enum value each one reads as,
// its aliases (other accepted spellings) and an optional note for the error text, so what is
// accepted is exactly what is declared (tests/unit/test_config_choices.cpp checks both ways):
//
//   enum class Mode { fast, safe };
//   inline constexpr config::Choice kModes[] = {config::choice(Mode::fast, "fast", "quick"),
//                                               config::choice(Mode::safe, "safe")};
//   inline constexpr config::Choices kModeChoices{kModes};
//   inline constexpr config::Var mode{name, Kind::choice, ..., &kModeChoices, true};  // KOLO_MODE
//   Mode m = config::get_choice<Mode>(env, mode).value_or(Mode::fast);
//
// A bad value is a ConfigError naming the variable, the value and the declared values:
// `KOLO_MODE=slow is not one of fast, safe`.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"

namespace kolo::config {

// What a value looks like (and so which bad values the sweep tries).
enum class Kind : unsigned char {
  integer,     // a decimal integer in [min, max]
  real,        // a decimal number in [min, max]
  flag,        // 0 or 1
  choice,      // one of `choices` (read with get_choice)
  rules,       // per-size-range algorithm rules, e.g. "tree:0-64K;ring:65537-max"
  host_port,   // host:port
  host_ports,  // host:port,host:port,... in rank order
  id_list,     // comma-separated non-negative integers
  secret,      // a key of at least 8 characters; never echoed in errors
  address,     // an IP address or host name
  text,        // free-form (a name, a path)
  fd,          // an inherited file descriptor
};

// Where the variable is documented (a table of docs/environment.md each).
enum class Section : unsigned char {
  contract,   // what every launcher exports
  transport,  // how ranks reach each other
  selection,  // algorithm selection
  engine,     // the Engine and compression
  gpu,
  mpi,
  torch,
  spark,
  launcher,  // read by kolo-run
  build,     // read when building kolo_torch (pip install backends/torch)
  internal,  // set by kolo_spark for its own processes; not for users
};

// Who reads it (the sweep calls that reader; `none` is exported by a launcher for programs,
// or read by Python code).
enum class Reader : unsigned char {
  topology,
  log_level,
  route,
  mesh,
  communicator,
  engine,
  compression,
  gpu,
  mpi,
  torch,
  spark_data,
  none,
};

// One accepted value of a choice variable.
struct Choice {
  long long value = 0;            // the enum value it reads as (choice() below sets it)
  std::string_view name;          // the canonical spelling: docs and error messages show it
  std::string_view aliases = {};  // other accepted spellings, comma-separated
  std::string_view note = {};     // shown after the name in the error: "on (in pieces)"
  // `name` is "PREFIX:ARG" (e.g. "file:PATH"): a value is PREFIX: followed by a non-empty
  // argument, which the reader returns (get_choice_arg).
  bool argument = false;
};

// Declares a value of a choice: `choice(Mode::fast, "fast", "quick")`.
template <class E>
constexpr Choice choice(E value, std::string_view name, std::string_view aliases = {},
                        std::string_view note = {}) {
  return Choice{static_cast<long long>(value), name, aliases, note, false};
}

// Declares a value that carries an argument: `choice_with_argument(Src::file, "file:PATH")`.
template <class E>
constexpr Choice choice_with_argument(E value, std::string_view name) {
  return Choice{static_cast<long long>(value), name, {}, {}, true};
}

// How the accepted values are listed in an error.
enum class ListStyle : unsigned char {
  one_of,  // "is not one of a, b, c"
  either,  // "is not a, b or c"
};

// The declared values of a choice variable and how a value is matched against them.
struct Choices {
  std::span<const Choice> values;
  bool ignore_case = false;  // match in any case (the argument of a file:PATH keeps its case)
  bool trim = false;         // surrounding spaces and tabs are ignored
  ListStyle style = ListStyle::one_of;
};

struct Var {
  std::string_view name;
  Kind kind;
  Section section;
  Reader reader;
  double min = 0;  // numeric kinds: accepted range, inclusive
  double max = 0;
  std::string_view default_value = {};  // as the docs show it; empty: none
  std::string_view meaning = {};
  std::string_view aliases = {};     // names read when this one is absent
  const Choices* choices = nullptr;  // Kind::choice: the declared values
  // Set but empty means unset (launchers export variables empty rather than not at all).
  bool empty_is_unset = false;
};

// The items of a comma-separated list, surrounding spaces removed, empty items dropped.
inline std::vector<std::string_view> split_list(std::string_view list) {
  std::vector<std::string_view> out;
  while (!list.empty()) {
    const auto comma = list.find(',');
    std::string_view item = list.substr(0, comma);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string_view::npos) break;
    list.remove_prefix(comma + 1);
  }
  return out;
}

// The variable's name followed by its aliases, in the order they are read.
inline std::vector<std::string> names_of(const Var& v) {
  std::vector<std::string> out{std::string(v.name)};
  for (std::string_view a : split_list(v.aliases)) out.emplace_back(a);
  return out;
}

// The declaration named `name` in `vars`, or nullptr.
inline const Var* find_in(std::span<const Var* const> vars, std::string_view name) {
  for (const Var* v : vars) {
    if (v->name == name) return v;
  }
  return nullptr;
}

// Every spelling a choice accepts as its canonical name, then its aliases; a value with an
// argument is listed by its name ("file:PATH").
inline std::vector<std::string_view> spellings_of(const Choice& c) {
  std::vector<std::string_view> out{c.name};
  for (std::string_view a : split_list(c.aliases)) out.push_back(a);
  return out;
}

namespace detail {

inline std::string range_text(const Var& v) {
  auto num = [](double d) {
    if (d == static_cast<double>(static_cast<long long>(d))) {
      return std::to_string(static_cast<long long>(d));
    }
    std::string s = std::to_string(d);
    while (!s.empty() && s.back() == '0') s.pop_back();
    return s;
  };
  // Appended piece by piece: GCC 12 at -O3 reports a false -Wrestrict on `"[" + std::string&&`.
  std::string out = "[";
  out += num(v.min);
  out += ", ";
  out += num(v.max);
  out += ']';
  return out;
}

[[noreturn]] inline void out_of_range(const Var& v, const std::string& value) {
  throw ConfigError(std::string(v.name) + "=" + value + " is out of range " + range_text(v));
}

// The raw value: nullopt when unset, or set-but-empty for variables where that means unset.
inline std::optional<std::string> raw(const EnvLookup& env, const Var& v) {
  auto s = env(std::string(v.name));
  if (s && s->empty() && v.empty_is_unset) return std::nullopt;
  return s;
}

inline char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

inline bool same_text(std::string_view a, std::string_view b, bool ignore_case) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ignore_case ? lower(a[i]) != lower(b[i]) : a[i] != b[i]) return false;
  }
  return true;
}

inline std::string_view trim_space(std::string_view s) {
  auto space = [](char c) { return c == ' ' || c == '\t'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

// The declared values as an error lists them: "a, b (note), c" or "a, b or c".
inline std::string allowed_text(const Choices& cs) {
  std::string out;
  for (std::size_t i = 0; i < cs.values.size(); ++i) {
    const Choice& c = cs.values[i];
    if (i > 0) out += cs.style == ListStyle::either && i + 1 == cs.values.size() ? " or " : ", ";
    out += c.name;
    if (!c.note.empty()) {
      out += " (";
      out += c.note;
      out += ')';
    }
  }
  return out;
}

// The declared choice `value` spells, and its argument; nullptr when none.
inline const Choice* match(const Choices& cs, std::string_view value, std::string* argument) {
  if (cs.trim) value = trim_space(value);
  for (const Choice& c : cs.values) {
    if (c.argument) {
      const std::string_view prefix = c.name.substr(0, c.name.find(':') + 1);
      if (value.size() > prefix.size() &&
          same_text(value.substr(0, prefix.size()), prefix, cs.ignore_case)) {
        if (argument) *argument = std::string(value.substr(prefix.size()));
        return &c;
      }
      continue;
    }
    for (std::string_view s : spellings_of(c)) {
      if (same_text(value, s, cs.ignore_case)) return &c;
    }
  }
  return nullptr;
}

[[noreturn]] inline void not_a_choice(const Var& v, std::string_view value) {
  const char* lead = v.choices->style == ListStyle::either ? " is not " : " is not one of ";
  throw ConfigError(std::string(v.name) + "=" + std::string(value) + lead +
                    allowed_text(*v.choices));
}

}  // namespace detail

// Whether the variable is set (an empty value of an empty_is_unset variable is not).
inline bool is_set(const EnvLookup& env, const Var& v) {
  return detail::raw(env, v).has_value();
}

// Readers. Each takes the declaration, so the name, range and empty-means-unset rule come from
// the table; errors name the variable and its value (`KOLO_SHM_SLOTS=1 is out of range [2,
// 1024]`). Surrounding spaces are trimmed alike for every numeric kind.
inline std::optional<long long> get_int(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  const long long x = parse_env_int(v.name, *s);
  if (static_cast<double>(x) < v.min || static_cast<double>(x) > v.max) {
    detail::out_of_range(v, *s);
  }
  return x;
}

inline std::optional<double> get_real(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  const double x = parse_env_double(v.name, *s);
  if (!(x >= v.min && x <= v.max)) detail::out_of_range(v, *s);
  return x;
}

inline std::optional<bool> get_flag(const EnvLookup& env, const Var& v) {
  const auto x = get_int(env, v);
  if (!x) return std::nullopt;
  return *x != 0;
}

// The value as given (no parsing); the caller validates what "text" means for it.
inline std::optional<std::string> get_text(const EnvLookup& env, const Var& v) {
  return detail::raw(env, v);
}

// A value of a choice, with the argument of a "PREFIX:ARG" choice (empty for the others).
template <class E>
struct Chosen {
  E value;
  std::string argument;
};

// `value` (from the environment or an option string) as the enum its declared choice reads as;
// a ConfigError naming the variable and the declared values when it spells none of them.
template <class E>
Chosen<E> parse_choice_arg(const Var& v, std::string_view value) {
  std::string arg;
  const Choice* c = detail::match(*v.choices, value, &arg);
  if (!c) detail::not_a_choice(v, value);
  return Chosen<E>{static_cast<E>(c->value), std::move(arg)};
}

template <class E>
E parse_choice(const Var& v, std::string_view value) {
  const Choice* c = detail::match(*v.choices, value, nullptr);
  if (!c) detail::not_a_choice(v, value);
  return static_cast<E>(c->value);
}

// The variable as its enum; nullopt when unset.
template <class E>
std::optional<E> get_choice(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  return parse_choice<E>(v, *s);
}

template <class E>
std::optional<Chosen<E>> get_choice_arg(const EnvLookup& env, const Var& v) {
  const auto s = detail::raw(env, v);
  if (!s) return std::nullopt;
  return parse_choice_arg<E>(v, *s);
}

// The canonical name of the choice that reads as `value` ("" if none is declared).
template <class E>
std::string_view choice_name(const Var& v, E value) {
  for (const Choice& c : v.choices->values) {
    if (c.value == static_cast<long long>(value)) return c.name;
  }
  return {};
}

}  // namespace kolo::config
