// kolo-run's command line: the usage text, Options, and parse_args() with its helpers (numbers,
// seconds, -H host:slots lists, ssh command words, -x names); every mistake is a UsageError
// naming the argument.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo_run/common.hpp"

namespace kolo_run {

constexpr const char* kUsage =
    "usage: kolo-run -np N [options] [--] program [args...]\n"
    "\n"
    "Starts N ranks of `program`, hosts kolo's rendezvous store, and gives each rank the\n"
    "environment contract (KOLO_RANK, KOLO_SIZE, KOLO_LOCAL_RANK, KOLO_LOCAL_SIZE,\n"
    "KOLO_CROSS_RANK, KOLO_CROSS_SIZE, KOLO_STORE, KOLO_SECRET, KOLO_HOST_KEY).\n"
    "\n"
    "options:\n"
    "  -np, -n, --np N           number of ranks (required, at least 1)\n"
    "  -H, --hosts H:S[,H:S...]  hosts and their slot counts; ranks fill the hosts in order.\n"
    "                            A host is this machine (localhost, 127.0.0.1, its hostname or\n"
    "                            one of its addresses), a network namespace listed in\n"
    "                            /var/run/netns, or else a machine reached with ssh "
    "([user@]host).\n"
    "                            Default: all ranks on this machine.\n"
    "  --store-host ADDR         address the ranks use to reach the store (required when a rank\n"
    "                            runs in a network namespace, or when ranks run both on this\n"
    "                            machine and over ssh; ssh ranks otherwise use the address their\n"
    "                            ssh connection came from)\n"
    "  --ssh COMMAND             the ssh command for remote hosts, split into words like a shell\n"
    "                            would (e.g. \"ssh -p 2222 -i ~/.ssh/id_cluster\"); default: the\n"
    "                            KOLO_RUN_SSH environment variable, else \"ssh\". kolo-run adds\n"
    "                            -T -o BatchMode=yes -o ConnectTimeout=30 to it (yours win)\n"
    "  -x NAME[=VALUE]           NAME=VALUE: set NAME for every rank; NAME: also pass this\n"
    "                            environment's NAME to ssh ranks (repeatable). ssh ranks get\n"
    "                            every KOLO_* variable of this environment by themselves\n"
    "  --timeout SECONDS         kill all ranks and exit 124 if the job runs longer\n"
    "  --grace SECONDS           after a rank fails, how long the others may take to exit\n"
    "                            before SIGTERM (default 3); SIGKILL follows 2 s later\n"
    "  --elastic[=MIN_NP]        a rank that fails while at least MIN_NP ranks (default 1)\n"
    "                            still run does not end the job: the others may shrink their\n"
    "                            communicator and go on (docs/reliability.md); the job's status\n"
    "                            is then the survivors'\n"
    "  --no-prefix               do not prefix output lines with \"[rank] \"\n"
    "  -h, --help                print this help\n"
    "\n"
    "exit status: 0 when every rank succeeded; otherwise the first failing rank's exit code\n"
    "(128+S if it died of signal S); 124 after --timeout; 127 if the program is not found,\n"
    "126 if it cannot be executed (on an ssh host: that rank's code); 255 when ssh itself\n"
    "failed for a rank; 2 for bad arguments.\n";

struct HostSpec {
  std::string name;
  int slots = 0;
};

struct Options {
  int np = 0;
  std::vector<HostSpec> hosts;  // empty: all ranks on this machine, host key "local"
  std::optional<std::string> store_host;
  std::optional<double> timeout;
  std::string timeout_text;  // as the user wrote it, for the timeout message
  double grace = 3.0;
  std::string grace_text = "3";
  bool prefix = true;
  bool help = false;
  int elastic_min = 0;  // --elastic[=MIN_NP]: > 0 tolerates failures while this many ranks run
  std::optional<std::string> ssh;    // --ssh, as written
  std::vector<std::string> exports;  // -x NAME or NAME=VALUE, in order
  std::vector<std::string> command;
};

inline std::optional<long long> parse_int(std::string_view s) {
  long long v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size()) return std::nullopt;
  return v;
}

inline std::optional<double> parse_seconds(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// The variables kolo-run sets per rank (they replace inherited ones), and those it drops
// because they describe the job kolo-run itself may be part of (a stale fd number, another
// job's peers, another job's KOLO_JOB_ID, which would bind the ranks' store handshake to a job
// kolo-run's store is not: its fresh per-job secret already keeps jobs apart) and would mislead
// the ranks.
inline const std::set<std::string>& contract_variables() {
  static const std::set<std::string> names = {
      "KOLO_RANK",       "KOLO_SIZE",       "KOLO_LOCAL_RANK", "KOLO_LOCAL_SIZE",
      "KOLO_CROSS_RANK", "KOLO_CROSS_SIZE", "KOLO_STORE",      "KOLO_SECRET",
      "KOLO_HOST_KEY",   "KOLO_PEERS",      "KOLO_LISTEN_FD",  "KOLO_JOB_ID"};
  return names;
}

inline bool is_contract_variable(const std::string& name) {
  return contract_variables().count(name) != 0;
}

// Splits an ssh command line into words as a POSIX shell would, without expansions: blanks
// separate words; '...' keeps everything literally; "..." keeps everything but \" and \\; a
// backslash outside quotes takes the next character literally.
inline std::vector<std::string> split_words(const std::string& line, const std::string& what) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == ' ' || c == '\t' || c == '\n') {
      if (in_word) words.push_back(std::move(word));
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\'') {
      const auto end = line.find('\'', i + 1);
      if (end == std::string::npos) throw UsageError(what + " has an unterminated ' quote");
      word.append(line, i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      for (++i;; ++i) {
        if (i >= line.size()) throw UsageError(what + " has an unterminated \" quote");
        if (line[i] == '"') break;
        if (line[i] == '\\' && i + 1 < line.size() && (line[i + 1] == '"' || line[i + 1] == '\\')) {
          ++i;
        }
        word += line[i];
      }
    } else if (c == '\\' && i + 1 < line.size()) {
      word += line[++i];
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(std::move(word));
  return words;
}

inline std::vector<HostSpec> parse_hosts(const std::string& value) {
  std::vector<HostSpec> hosts;
  std::set<std::string> seen;
  std::string_view rest = value;
  if (rest.empty()) throw UsageError("-H needs at least one host:slots entry");
  for (;;) {
    const auto comma = rest.find(',');
    const std::string_view item = rest.substr(0, comma);
    const auto colon = item.rfind(':');
    if (item.empty() || colon == std::string_view::npos || colon == 0) {
      throw UsageError("-H entry '" + std::string(item) + "' is not host:slots");
    }
    const std::string_view slots_text = item.substr(colon + 1);
    const auto slots = parse_int(slots_text);
    if (!slots || *slots < 1 || *slots > (1 << 20)) {
      throw UsageError("-H entry '" + std::string(item) + "' has slots '" +
                       std::string(slots_text) + "', which is not a positive integer");
    }
    HostSpec h{std::string(item.substr(0, colon)), static_cast<int>(*slots)};
    // A repeated host would make its local ranks ambiguous (one host key, two slot groups).
    if (!seen.insert(h.name).second) {
      throw UsageError("-H lists host '" + h.name + "' twice; give its slots once");
    }
    hosts.push_back(std::move(h));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return hosts;
}

inline Options parse_args(int argc, char** argv) {
  Options o;
  bool np_given = false;
  std::optional<std::string> hosts_text;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    // The first word that is not an option is the program (mpirun's convention), so the
    // program's own options need no "--".
    if (arg.size() < 2 || arg[0] != '-') break;
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (arg.rfind("--", 0) == 0) {
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        name = arg.substr(0, eq);
        inline_value = arg.substr(eq + 1);
      }
    }
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= argc) throw UsageError("option " + name + " needs a value");
      return argv[++i];
    };
    if (name == "-h" || name == "--help") {
      o.help = true;
      return o;
    } else if (name == "-np" || name == "-n" || name == "--np") {
      const std::string v = value();
      const auto n = parse_int(v);
      if (!n) throw UsageError(name + " '" + v + "' is not an integer");
      if (*n < 1) throw UsageError(name + " " + v + ": the number of ranks must be at least 1");
      if (*n > (1 << 20)) throw UsageError(name + " " + v + " is too many ranks");
      o.np = static_cast<int>(*n);
      np_given = true;
    } else if (name == "-H" || name == "--hosts" || name == "--host") {
      hosts_text = value();
    } else if (name == "--store-host") {
      o.store_host = value();
      if (o.store_host->empty()) throw UsageError("--store-host needs a non-empty address");
    } else if (name == "--timeout") {
      o.timeout_text = value();
      o.timeout = parse_seconds(o.timeout_text);
      if (!o.timeout || *o.timeout <= 0) {
        throw UsageError("--timeout '" + o.timeout_text + "' is not a positive number of seconds");
      }
    } else if (name == "--grace") {
      const std::string v = value();
      const auto g = parse_seconds(v);
      if (!g || *g < 0) throw UsageError("--grace '" + v + "' is not a number of seconds >= 0");
      o.grace = *g;
      o.grace_text = v;
    } else if (name == "--ssh") {
      o.ssh = value();
    } else if (name == "-x") {
      o.exports.push_back(value());
    } else if (name == "--elastic") {
      o.elastic_min = 1;
      if (inline_value) {
        const auto k = parse_int(*inline_value);
        if (!k || *k < 1) {
          throw UsageError("--elastic=" + *inline_value + ": MIN_NP must be an integer >= 1");
        }
        o.elastic_min = static_cast<int>(*k);
      }
    } else if (name == "--no-prefix") {
      if (inline_value) throw UsageError("option --no-prefix takes no value");
      o.prefix = false;
    } else {
      throw UsageError("unknown option '" + arg + "'");
    }
  }
  for (; i < argc; ++i) o.command.emplace_back(argv[i]);

  for (const auto& x : o.exports) {
    const std::string name = x.substr(0, x.find('='));
    const bool ok =
        !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
        std::all_of(name.begin(), name.end(),
                    [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; });
    if (!ok) throw UsageError("-x '" + x + "': expected NAME or NAME=VALUE");
    if (is_contract_variable(name)) {
      throw UsageError("-x " + name + ": kolo-run sets " + name + " itself, per rank");
    }
  }
  if (!np_given) throw UsageError("missing -np N (the number of ranks)");
  if (o.command.empty()) throw UsageError("missing the program to run");
  if (hosts_text) {
    o.hosts = parse_hosts(*hosts_text);
    long long slots = 0;
    for (const auto& h : o.hosts) slots += h.slots;
    if (slots < o.np) {
      throw UsageError("-H gives " + std::to_string(slots) + " slot(s) in total but -np is " +
                       std::to_string(o.np));
    }
  }
  return o;
}

}  // namespace kolo_run
