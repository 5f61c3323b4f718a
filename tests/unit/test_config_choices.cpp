// Choice variables accept exactly what they declare (core/config_var.hpp). For every
// Kind::choice variable of the one list (tests/common/config_table.hpp): every declared value and
// alias parses to its enum value through the table's reader; the library's own reader of the
// variable accepts every declared spelling and nothing else of a corpus of near misses (so
// nothing is accepted that is not declared); and a bad value is a ConfigError naming the
// variable, the value and the declared values, in the words the readers have always used.
#include <doctest/doctest.h>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "../common/config_table.hpp"
#include "kolo/communicator.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/error.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/transport/route.hpp"

namespace {

using kolo::config::Choice;
using kolo::config::Kind;
using kolo::config::Var;

kolo::EnvLookup only(const std::string& name, const std::string& value) {
  return [name, value](const std::string& n) -> std::optional<std::string> {
    if (n == name) return value;
    return std::nullopt;
  };
}

std::string upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

// The library's own reader of each choice variable; nullptr where it lives in another suite
// (KOLO_DATA_FORMAT: kolo::spark::load_data_shard, tests/spark).
using Reader = std::function<void(const kolo::EnvLookup&)>;
Reader reader_of(std::string_view name) {
  if (name == "KOLO_LOG_LEVEL") return [](const auto& e) { (void)kolo::log_level_from_env(e); };
  if (name == "KOLO_TRANSPORT") return [](const auto& e) { (void)kolo::route_mode_from_env(e); };
  if (name == "KOLO_COMPRESSION") {
    return [](const auto& e) { (void)kolo::CompressionPolicy::from_env(e); };
  }
  if (name == "KOLO_TUNING") return [](const auto& e) { (void)kolo::TuningSource::from_env(e); };
  if (name == "KOLO_FUSION_PIECES" || name == "KOLO_JOIN_AVERAGE") {
    return [](const auto& e) { (void)kolo::EngineOptions::from_env(e); };
  }
  return nullptr;
}

// The spellings to try on a variable: the declared ones, their other cases, and near misses.
std::vector<std::string> corpus(const Var& v) {
  std::vector<std::string> out = {"bogus", "1", "on,off", " none", "none ", "auto ", "x:"};
  for (const Choice& c : v.choices->values) {
    for (std::string_view s : kolo::config::spellings_of(c)) {
      std::string spelt(s);
      if (c.argument) spelt = spelt.substr(0, spelt.find(':') + 1) + "/tmp/x";
      out.push_back(spelt);
      out.push_back(upper(spelt));
      out.push_back(spelt + "s");
      out.push_back(spelt.substr(0, spelt.size() - 1));
      out.push_back(" " + spelt + " ");
    }
  }
  return out;
}

bool accepts(const std::function<void()>& read) {
  try {
    read();
    return true;
  } catch (const kolo::ConfigError&) {
    return false;
  }
}

}  // namespace

TEST_CASE("config choices: every declared value and alias parses to its enum value") {
  int spellings = 0;
  for (const Var* v : kolo::config::all_vars()) {
    if (v->kind != Kind::choice) continue;
    CAPTURE(v->name);
    REQUIRE(v->choices != nullptr);
    for (const Choice& c : v->choices->values) {
      for (std::string_view s : kolo::config::spellings_of(c)) {
        std::string spelt(s);
        std::string arg;
        if (c.argument) {
          spelt = spelt.substr(0, spelt.find(':') + 1) + "/some/Path";
          arg = "/some/Path";
        }
        CAPTURE(spelt);
        const auto got = kolo::config::parse_choice_arg<long long>(*v, spelt);
        CHECK(got.value == c.value);
        CHECK(got.argument == arg);
        if (v->choices->ignore_case) {
          CHECK(kolo::config::parse_choice<long long>(*v, upper(spelt)) == c.value);
        }
        ++spellings;
      }
    }
  }
  CHECK(spellings >= 25);
}

TEST_CASE("config choices: the library's readers accept exactly the declared spellings") {
  int checked = 0;
  for (const Var* v : kolo::config::all_vars()) {
    if (v->kind != Kind::choice) continue;
    const Reader read = reader_of(v->name);
    if (!read) continue;
    const std::string name(v->name);
    for (const std::string& value : corpus(*v)) {
      CAPTURE(name);
      CAPTURE(value);
      const bool declared =
          accepts([&] { (void)kolo::config::parse_choice_arg<long long>(*v, value); });
      const bool accepted = accepts([&] { read(only(name, value)); });
      CHECK_MESSAGE(declared == accepted,
                    (accepted ? "accepted but not declared" : "declared but not accepted"));
      ++checked;
    }
    // Unset, and empty (which means unset for every choice variable), read as the default.
    CHECK(accepts([&] { read(only("KOLO_OTHER", "x")); }));
    CHECK(v->empty_is_unset);
    CHECK(accepts([&] { read(only(name, "")); }));
  }
  CHECK(checked >= 100);
}

TEST_CASE("config choices: a bad value names the variable, the value and the declared values") {
  for (const Var* v : kolo::config::all_vars()) {
    if (v->kind != Kind::choice) continue;
    CAPTURE(v->name);
    std::string what;
    try {
      (void)kolo::config::parse_choice<long long>(*v, "bogus");
    } catch (const kolo::ConfigError& e) {
      what = e.what();
    }
    CHECK(what.find(std::string(v->name) + "=bogus is not ") == 0);
    for (const Choice& c : v->choices->values) CHECK(what.find(c.name) != std::string::npos);
  }
  // The words each reader has always used.
  const std::map<std::string, std::string> kMessages = {
      {"KOLO_LOG_LEVEL", "KOLO_LOG_LEVEL=bogus is not one of off, error, warning, info, debug"},
      {"KOLO_TRANSPORT", "KOLO_TRANSPORT=bogus is not one of shm, tcp, routed"},
      {"KOLO_COMPRESSION", "KOLO_COMPRESSION=bogus is not one of none, fp16, bf16"},
      {"KOLO_TUNING", "KOLO_TUNING=bogus is not one of probe, default, file:PATH"},
      {"KOLO_FUSION_PIECES",
       "KOLO_FUSION_PIECES=bogus is not one of on (fused batches in pieces, no fusion-buffer "
       "copies), off (through the fusion buffer)"},
      {"KOLO_JOIN_AVERAGE",
       "KOLO_JOIN_AVERAGE=bogus is not one of world (divide by the number of ranks), active "
       "(divide by the ranks that have not joined)"},
      {"KOLO_DATA_FORMAT", "KOLO_DATA_FORMAT=bogus is not csv, f64 or bin"},
  };
  for (const auto& [name, message] : kMessages) {
    CAPTURE(name);
    const Var* v = kolo::config::find_any(name);
    REQUIRE(v != nullptr);
    CHECK_THROWS_WITH(kolo::config::parse_choice<long long>(*v, "bogus"), message.c_str());
    if (const Reader read = reader_of(name)) {
      CHECK_THROWS_WITH(read(only(name, "bogus")), message.c_str());
    }
  }
}

TEST_CASE("config choices: readers return the enum of the value given") {
  using kolo::RouteMode;
  CHECK(kolo::route_mode_from_env(only("KOLO_TRANSPORT", "auto")) == RouteMode::routed);
  CHECK(kolo::route_mode_from_env(only("KOLO_TRANSPORT", "shm")) == RouteMode::shm_only);
  CHECK(kolo::route_mode_from_env(only("KOLO_OTHER", "shm")) == RouteMode::routed);
  CHECK(kolo::log_level_from_env(only("KOLO_LOG_LEVEL", "WARN")) == kolo::LogLevel::warning);
  CHECK(kolo::log_level_from_env(only("KOLO_LOG_LEVEL", "None")) == kolo::LogLevel::off);
  CHECK(kolo::CompressionPolicy::parse("bfloat16").name == "bf16");
  CHECK_FALSE(kolo::CompressionPolicy::parse("none").enabled());
  const auto file = kolo::config::get_choice_arg<kolo::TuningKind>(
      only("KOLO_TUNING", " file:/tmp/Tune.txt "), kolo::config::vars::tuning);
  REQUIRE(file);
  CHECK(file->value == kolo::TuningKind::file);
  CHECK(file->argument == "/tmp/Tune.txt");
  CHECK(kolo::config::choice_name(kolo::config::vars::join_average,
                                  kolo::JoinAverage::active_ranks) == "active");
  CHECK(kolo::config::get_choice<bool>(only("KOLO_FUSION_PIECES", "off"),
                                       kolo::config::vars::fusion_pieces) == false);
}
