// Where kolo-run's ranks run: each -H host classified (this machine, a network namespace, an
// ssh host), the ranks' plan (local/cross ranks and host keys, hosts filled in -H order), and
// the program and `ip` resolved the way execvp would, before anything starts.
#pragma once

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo_run/args.hpp"
#include "kolo_run/common.hpp"

namespace kolo_run {

enum class HostKind { this_machine, netns, ssh };

// An address of one of this machine's interfaces (numeric, as getifaddrs gives them).
inline bool is_own_address(const std::string& h) {
  std::string addr = h;
  if (addr.size() > 2 && addr.front() == '[' && addr.back() == ']') {
    addr = addr.substr(1, addr.size() - 2);
  }
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[NI_MAXHOST] = {};
    const socklen_t len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    if (::getnameinfo(a->ifa_addr, len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) {
      continue;
    }
    std::string t(text);
    t = t.substr(0, t.find('%'));  // fe80::1%eth0: the scope is not part of what users write
    found = t == addr;
  }
  ::freeifaddrs(list);
  return found;
}

inline bool is_this_machine(const std::string& h) {
  if (h == "localhost" || h == "127.0.0.1" || h == "::1") return true;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) == 0) {
    const std::string full(name);
    if (h == full || h == full.substr(0, full.find('.'))) return true;
  }
  return is_own_address(h);
}

inline bool is_netns(const std::string& h) {
  // A name with '/' would let "-H ../../x" point anywhere: netns names are single components.
  if (h.empty() || h == "." || h == ".." || h.find('/') != std::string::npos) return false;
  struct stat st {};
  return ::stat(("/var/run/netns/" + h).c_str(), &st) == 0;
}

inline bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

struct RankPlan {
  int local_rank = 0;
  int local_size = 0;
  int cross_rank = 0;
  int cross_size = 0;
  std::string host_key;
  HostKind kind = HostKind::this_machine;
};

inline std::vector<RankPlan> plan_ranks(const Options& o) {
  std::vector<HostSpec> hosts = o.hosts;
  const bool default_host = hosts.empty();
  if (default_host) hosts.push_back({"local", o.np});
  std::vector<HostKind> kinds;
  for (const auto& h : hosts) {
    if (default_host || is_this_machine(h.name)) {
      kinds.push_back(HostKind::this_machine);
    } else if (is_netns(h.name)) {
      kinds.push_back(HostKind::netns);
    } else {
      // Anything else is another machine, reached with ssh ([user@]host, or an alias of the
      // user's ssh configuration).
      kinds.push_back(HostKind::ssh);
    }
  }
  // Fill hosts in -H order; hosts left without ranks do not count as hosts of the job.
  std::vector<RankPlan> plan;
  int cross = 0;
  for (std::size_t h = 0; h < hosts.size() && static_cast<int>(plan.size()) < o.np; ++h) {
    const int here = std::min(hosts[h].slots, o.np - static_cast<int>(plan.size()));
    for (int l = 0; l < here; ++l) {
      RankPlan p;
      p.local_rank = l;
      p.local_size = here;
      p.cross_rank = cross;
      p.host_key = hosts[h].name;
      p.kind = kinds[h];
      plan.push_back(std::move(p));
    }
    ++cross;
  }
  for (auto& p : plan) p.cross_size = cross;
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Finding the program (before anything starts, so a typo costs no half-started job).

inline std::string getenv_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string(fallback);
}

// Resolves `prog` like execvp would. Throws LaunchError 127 (not found) or 126 (found, but
// not an executable file), naming the path.
inline std::string resolve_program(const std::string& prog) {
  auto check = [](const std::string& path) -> int {  // 0 ok, else errno
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    if (::access(path.c_str(), X_OK) != 0) return errno;
    return 0;
  };
  if (prog.find('/') != std::string::npos) {
    const int err = check(prog);
    if (err == 0) return prog;
    throw LaunchError("cannot execute '" + prog + "': " + std::strerror(err),
                      err == ENOENT || err == ENOTDIR ? kExitNotFound : kExitNotExecutable);
  }
  const std::string path = getenv_or("PATH", "/usr/local/bin:/usr/bin:/bin");
  std::optional<std::pair<std::string, int>> unusable;
  std::string_view rest = path;
  for (;;) {
    const auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";  // POSIX: an empty PATH entry is the current directory
    const std::string candidate = dir + "/" + prog;
    const int err = check(candidate);
    if (err == 0) return candidate;
    if (err != ENOENT && err != ENOTDIR && !unusable) unusable.emplace(candidate, err);
    if (colon == std::string_view::npos) break;
    rest.remove_prefix(colon + 1);
  }
  if (unusable) {
    throw LaunchError(
        "cannot execute '" + unusable->first + "': " + std::strerror(unusable->second),
        kExitNotExecutable);
  }
  throw LaunchError("cannot execute '" + prog + "': not found in PATH=" + path, kExitNotFound);
}

inline std::string find_ip_command() {
  // `ip` lives in sbin, which a user's PATH often lacks.
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  try {
    return resolve_program("ip");
  } catch (const LaunchError&) {
    throw LaunchError(
        "the ip command (iproute2) is needed to start ranks in a network namespace, but it was "
        "not found in /usr/sbin, /sbin or PATH",
        kExitNotFound);
  }
}

}  // namespace kolo_run
