// kolo_env_doc — writes docs/environment.md from the declarations of every layer
// (tests/common/config_table.hpp lists them), so the page cannot drift from what kolo parses.
//
//   kolo_env_doc                 the page on stdout (regenerate: kolo_env_doc >
//   docs/environment.md) kolo_env_doc --check FILE    exit 1 with a diff hint when FILE differs
//   from the page kolo_env_doc --names         every declared name and alias, one per line (CTest
//   docs/env_names)
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

#include "../common/config_table.hpp"

namespace {

using kolo::config::Kind;
using kolo::config::Section;
using kolo::config::Var;

struct SectionText {
  Section section;
  const char* title;
  const char* intro;
};

constexpr SectionText kSections[] = {
    {Section::contract, "The launcher contract",
     "What every launcher (kolo-run, mpirun, torchrun, the Spark backend) exports to each rank; "
     "`kolo::Topology::from_env()` reads it. A `KOLO_` name wins; its aliases (the names of the "
     "launchers people already use) are read, in the order listed, when it is absent."},
    {Section::transport, "Transport",
     "How ranks reach each other ([architecture.md](architecture.md))."},
    {Section::selection, "Algorithm selection",
     "Which algorithm runs a collective ([algorithms.md](algorithms.md))."},
    {Section::engine, "Engine and compression",
     "The background engine and its wire compression ([engine.md](engine.md), "
     "[optimizer.md](optimizer.md))."},
    {Section::gpu, "GPU", "Read by `CudaStagedTransport` and `NcclTransport` ([gpu.md](gpu.md))."},
    {Section::mpi, "MPI", "Read by `MpiTransport` and `MpiNativeTransport` ([mpi.md](mpi.md))."},
    {Section::torch, "PyTorch backend", "Read by `kolo_torch` ([torch.md](torch.md))."},
    {Section::spark, "Spark data shards and elastic runs",
     "The `KOLO_DATA_*` variables are exported by `kolo_spark.run(..., df=...)` and read by "
     "`kolo::spark::DataShard`; the `KOLO_SPARK_*` ones by `run(..., elastic=True)` or "
     "`max_attempts` > 1, beside `KOLO_STORE` and `KOLO_JOB_ID` (the store the driver hosts), "
     "and read by `kolo_spark.elastic` ([spark.md](spark.md)). The Spark backend also exports "
     "torchrun's variables "
     "(`MASTER_ADDR`, `MASTER_PORT`, `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, "
     "`GROUP_RANK`) and, for a rank with GPUs, `CUDA_VISIBLE_DEVICES` with "
     "`KOLO_CUDA_DEVICE=0`."},
    {Section::launcher, "kolo-run",
     "kolo-run passes every `KOLO_*` variable of its own environment on to ranks on ssh hosts "
     "(except `KOLO_ADDR` and this one) ([multihost.md](multihost.md))."},
    {Section::build, "Building the PyTorch backend",
     "Read by `pip install backends/torch` ([torch.md](torch.md)), not by the library."},
    {Section::internal, "Internal",
     "Set by `kolo_spark` for the Python process of a function rank and removed from its "
     "environment when it starts; listed so that nothing kolo reads is undocumented."},
};

std::string number(double d) {
  if (d == static_cast<double>(static_cast<long long>(d))) {
    const auto v = static_cast<long long>(d);
    // Powers of two read better as such.
    for (int k = 10; k < 63; ++k) {
      if (v == (1ll << k) && k >= 16) return "2^" + std::to_string(k);
      if (v == (1ll << k) - 1 && k >= 16) return "2^" + std::to_string(k) + "-1";
    }
    return std::to_string(v);
  }
  std::ostringstream o;
  o << d;
  return o.str();
}

std::string accepted(const Var& v) {
  switch (v.kind) {
    case Kind::integer:
      return "integer in [" + number(v.min) + ", " + number(v.max) + "]";
    case Kind::real:
      return "number in [" + number(v.min) + ", " + number(v.max) + "]";
    case Kind::flag:
      return "`0` or `1`";
    case Kind::choice: {
      // Each declared value with its aliases: what is listed is exactly what is accepted.
      std::string out;
      for (const kolo::config::Choice& c : v.choices->values) {
        if (!out.empty()) out += ", ";
        out += "`" + std::string(c.name) + "`";
        const auto aliases = kolo::config::split_list(c.aliases);
        for (std::size_t i = 0; i < aliases.size(); ++i) {
          out += i == 0 ? " (or `" : ", `";
          out += std::string(aliases[i]) + "`";
        }
        if (!aliases.empty()) out += ")";
      }
      if (v.choices->ignore_case) out += ", in any case";
      return out;
    }
    case Kind::rules:
      return "`NAME:LO-HI;...` rules or one `NAME` (every size)";
    case Kind::host_port:
      return "`host:port`";
    case Kind::host_ports:
      return "`host:port,...`";
    case Kind::id_list:
      return "ids `0,1,...`";
    case Kind::secret:
      return "8 or more characters";
    case Kind::address:
      return "IP address or host name";
    case Kind::text:
      return "text";
    case Kind::fd:
      return "an open socket's fd";
  }
  return "";
}

std::string page() {
  std::ostringstream o;
  o << "# Environment variables\n\n"
       "<!-- Generated by tests/docs/env_doc.cpp from the declarations each layer keeps next to "
       "its code (include/kolo/core/config.hpp names the files): edit them, then run "
       "`build/tests/kolo_env_doc > docs/environment.md`. CTest "
       "docs/environment fails when this page and the table disagree. -->\n\n"
       "Every `KOLO_*` variable kolo reads, declared once, next to the code that reads it "
       "(name, accepted values, default, meaning; `kolo/core/config.hpp` names the files). A bad "
       "value is a `ConfigError` that names the "
       "variable and the value (`KOLO_RANK=5 is not below KOLO_SIZE=4`, `KOLO_SHM_SLOTS=1 is out "
       "of range [2, 1024]`; `KOLO_SECRET` is never echoed), raised on every rank alike, never a "
       "crash or a silent default. Surrounding spaces around numbers are ignored. Where a row "
       "says *empty = unset*, a variable exported with an empty value counts as not set "
       "(launchers often export empty values).\n";
  for (const SectionText& s : kSections) {
    bool any_alias = false;
    for (const Var* v : kolo::config::all_vars()) {
      if (v->section == s.section && !v->aliases.empty()) any_alias = true;
    }
    o << "\n## " << s.title << "\n\n" << s.intro << "\n\n";
    o << "| variable | meaning | accepted | default |" << (any_alias ? " aliases |" : "") << "\n";
    o << "| --- | --- | --- | --- |" << (any_alias ? " --- |" : "") << "\n";
    for (const Var* v : kolo::config::all_vars()) {
      if (v->section != s.section) continue;
      o << "| `" << v->name << "` | " << v->meaning << " | " << accepted(*v)
        << (v->empty_is_unset ? "; empty = unset" : "") << " | "
        << (v->default_value.empty() ? "-" : v->default_value) << " |";
      if (any_alias) {
        std::string aliases;
        for (const std::string& n : kolo::config::names_of(*v)) {
          if (n == v->name) continue;
          if (!aliases.empty()) aliases += ", ";
          aliases += "`" + n + "`";
        }
        o << " " << (aliases.empty() ? "" : aliases) << " |";
      }
      o << "\n";
    }
  }
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "";
  if (arg == "--names") {
    for (const Var* v : kolo::config::all_vars()) {
      for (const std::string& n : kolo::config::names_of(*v)) std::cout << n << "\n";
    }
    return 0;
  }
  if (arg == "--check") {
    if (argc < 3) {
      std::cerr << "usage: kolo_env_doc --check docs/environment.md\n";
      return 2;
    }
    std::ifstream in(argv[2]);
    std::stringstream have;
    have << in.rdbuf();
    if (!in && have.str().empty()) {
      std::cerr << "kolo_env_doc: cannot read " << argv[2] << "\n";
      return 1;
    }
    const std::string want = page();
    if (have.str() == want) {
      std::cout << argv[2] << " matches the configuration table ("
                << kolo::config::all_vars().size() << " variables)\n";
      return 0;
    }
    // Name the first line that differs.
    std::istringstream a(have.str()), b(want);
    std::string la, lb;
    int line = 0;
    while (true) {
      ++line;
      const bool ga = static_cast<bool>(std::getline(a, la));
      const bool gb = static_cast<bool>(std::getline(b, lb));
      if (!ga && !gb) break;
      if (!ga || !gb || la != lb) {
        std::cerr << argv[2] << " differs from the configuration table at line " << line
                  << ":\n  page:  " << (ga ? la : "<end>") << "\n  table: " << (gb ? lb : "<end>")
                  << "\nregenerate it: kolo_env_doc > docs/environment.md\n";
        break;
      }
    }
    return 1;
  }
  if (!arg.empty()) {
    std::cerr << "usage: kolo_env_doc [--check FILE | --names]\n";
    return 2;
  }
  std::cout << page();
  return 0;
}
