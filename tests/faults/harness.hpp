// harness.hpp — what the fault-injection drivers share: child processes with captured output
// and hard wall-clock limits, the report lines of fault_worker, kolo-run jobs, hand-launched
// ranks with a made-up environment contract, strangers that knock on ports, a delaying and
// recording TCP relay, and process/RSS probes.
//
// Every subprocess has a limit: when it passes, the processes are killed and the case fails, so
// a bug shows up as a failure rather than a stuck CTest.
#pragma once

#include <dirent.h>
#include <doctest/doctest.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <kolo/core/deadline.hpp>
#include <kolo/core/error.hpp>
#include <kolo/net/auth.hpp>
#include <kolo/net/socket.hpp>

#ifndef KOLO_RUN_EXE
#error "KOLO_RUN_EXE (path of kolo-run) must be defined by the build"
#endif
#ifndef KOLO_FAULT_WORKER_EXE
#error "KOLO_FAULT_WORKER_EXE (path of fault_worker) must be defined by the build"
#endif

extern char** environ;

namespace kolo_faults {

using WallClock = std::chrono::steady_clock;

inline double seconds_between(WallClock::time_point a, WallClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The test's own environment without anything that could configure a rank: each case states
// the whole contract itself, so a KOLO_* variable in the caller's shell cannot change a result.
inline std::vector<std::string> clean_env() {
  static const char* const kAliases[] = {
      "RANK=",       "WORLD_SIZE=",  "LOCAL_RANK=",  "LOCAL_WORLD_SIZE=",
      "GROUP_RANK=", "MASTER_ADDR=", "MASTER_PORT=", "OMPI_COMM_WORLD_",
      "HOROVOD_",    "PMI_",         "KOLO_"};
  std::vector<std::string> out;
  for (char** e = environ; *e; ++e) {
    const std::string v(*e);
    bool drop = false;
    for (const char* a : kAliases) drop = drop || v.rfind(a, 0) == 0;
    if (!drop) out.push_back(v);
  }
  return out;
}

// One child process, stdout and stderr merged into one captured pipe, optionally a writable
// stdin, optionally one inherited file descriptor (the rank's pre-bound listening socket).
class Proc {
 public:
  Proc(const std::vector<std::string>& args, const std::vector<std::string>& env,
       int inherit_fd = -1, bool with_stdin = false) {
    // Everything the child needs is built before fork(): other threads of this process may be
    // running (the strangers of the intrusion test), so the child may only make raw syscalls.
    std::vector<std::string> a = args, e = env;
    std::vector<char*> argv, envp;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    int out[2], in[2] = {-1, -1};
    REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    if (with_stdin) REQUIRE(::pipe2(in, O_CLOEXEC) == 0);
    const int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    start_ = WallClock::now();
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a crashed driver must not leave ranks behind
      ::dup2(with_stdin ? in[0] : devnull, 0);
      ::dup2(out[1], 1);
      ::dup2(out[1], 2);
      if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);  // survives exec: KOLO_LISTEN_FD
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    ::close(devnull);
    ::close(out[1]);
    out_fd_ = out[0];
    if (with_stdin) {
      ::close(in[0]);
      in_fd_ = in[1];
    }
  }

  Proc(const Proc&) = delete;
  Proc& operator=(const Proc&) = delete;

  ~Proc() {
    kill_now();
    if (out_fd_ >= 0) ::close(out_fd_);
    if (in_fd_ >= 0) ::close(in_fd_);
  }

  bool running() const { return !reaped_; }
  bool finished() const { return reaped_ && out_fd_ < 0; }
  int code() const { return code_; }
  const std::string& output() const { return out_; }
  double seconds() const { return seconds_between(start_, end_); }
  int out_fd() const { return out_fd_; }
  pid_t pid() const { return pid_; }

  void write_stdin(const std::string& s) {
    if (in_fd_ >= 0) {
      [[maybe_unused]] const ssize_t k = ::write(in_fd_, s.data(), s.size());
    }
  }

  // Reads what is there; at EOF (or an error) closes the pipe, which marks the end of output.
  void read_some() {
    char buf[65536];
    const ssize_t k = ::read(out_fd_, buf, sizeof(buf));
    if (k > 0) {
      out_.append(buf, static_cast<std::size_t>(k));
    } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
      ::close(out_fd_);
      out_fd_ = -1;
    }
  }

  void try_reap() {
    if (reaped_) return;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) set_status(status);
  }

  void kill_now() {
    if (reaped_ || pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    set_status(status);
  }

 private:
  void set_status(int status) {
    reaped_ = true;
    end_ = WallClock::now();
    code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid_ = -1;
  int out_fd_ = -1;
  int in_fd_ = -1;
  bool reaped_ = false;
  int code_ = -1;
  std::string out_;
  WallClock::time_point start_, end_;
};

// Collects the processes' output until `until()` holds or all have exited and closed their
// output; false if `limit` seconds pass first.
inline bool pump(const std::vector<Proc*>& procs, double limit,
                 const std::function<bool()>& until = nullptr) {
  const auto deadline = kolo::Deadline::after(limit);
  for (;;) {
    for (Proc* p : procs) p->try_reap();
    if (until && until()) return true;
    bool all = true;
    for (Proc* p : procs) all = all && p->finished();
    if (all) return true;
    const double left = deadline.remaining_seconds();
    if (left <= 0) return false;
    std::vector<pollfd> fds;
    std::vector<Proc*> owners;
    for (Proc* p : procs) {
      if (p->out_fd() >= 0) {
        fds.push_back({p->out_fd(), POLLIN, 0});
        owners.push_back(p);
      }
    }
    // Capped so exits are noticed (reaped) even while an output pipe stays open.
    const int ms = static_cast<int>(std::min(left, 0.05) * 1000) + 1;
    const int rc = ::poll(fds.data(), fds.size(), ms);
    if (rc <= 0) continue;
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0) owners[i]->read_some();
    }
  }
}

// Waits for every process to finish within `limit`, else kills them all; returns whether they
// finished on their own (the caller CHECKs it, with their output in the failure message).
inline bool finish_all(const std::vector<Proc*>& procs, double limit) {
  const bool ok = pump(procs, limit);
  if (!ok) {
    for (Proc* p : procs) p->kill_now();
    pump(procs, 2);  // collect what they had written
  }
  return ok;
}

// ---------------------------------------------------------------- reports

struct Report {
  std::string kind;
  double after = -1;
  double mono = -1;  // CLOCK_MONOTONIC seconds when the rank caught the error
  std::string what;
};

// "KOLO_FAULT rank=R kind=K after=A what=W" lines (with or without kolo-run's "[R] " prefix),
// by the rank they name.
inline std::map<std::string, Report> fault_reports(const std::string& out) {
  std::map<std::string, Report> reports;
  std::size_t pos = 0;
  while (pos < out.size()) {
    std::size_t eol = out.find('\n', pos);
    if (eol == std::string::npos) eol = out.size();
    const std::string line = out.substr(pos, eol - pos);
    pos = eol + 1;
    const auto at = line.find("KOLO_FAULT rank=");
    if (at == std::string::npos) continue;
    const std::string rest = line.substr(at + 16);
    const auto k = rest.find(" kind=");
    const auto a = rest.find(" after=");
    const auto w = rest.find(" what=");
    if (k == std::string::npos || a == std::string::npos || w == std::string::npos) continue;
    Report r;
    r.kind = rest.substr(k + 6, a - k - 6);
    r.after = std::atof(rest.substr(a + 7, w - a - 7).c_str());
    if (const auto m = rest.find(" mono="); m != std::string::npos && m < w) {
      r.mono = std::atof(rest.substr(m + 6, w - m - 6).c_str());
    }
    r.what = rest.substr(w + 6);
    reports[rest.substr(0, k)] = r;
  }
  return reports;
}

inline int count_of(const std::string& out, const std::string& needle) {
  int n = 0;
  for (std::size_t p = out.find(needle); p != std::string::npos; p = out.find(needle, p + 1)) ++n;
  return n;
}

inline bool contains(const std::string& s, const std::string& needle) {
  return s.find(needle) != std::string::npos;
}

// The value of ` key=` in a worker's output line, up to the next space ("" when absent).
inline std::string field(const std::string& line, const std::string& key) {
  const auto at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const auto from = at + key.size() + 2;
  return line.substr(from, line.find(' ', from) - from);
}

// run(spec) for every spec, two at a time (the 2-core machine); the results in spec order.
template <class Spec, class Run>
auto run_two_at_a_time(const std::vector<Spec>& specs, Run run) {
  std::vector<decltype(run(specs.front()))> results(specs.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < specs.size();) results[i] = run(specs[i]);
    });
  }
  for (auto& t : workers) t.join();
  return results;
}

// ---------------------------------------------------------------- kolo-run jobs

struct JobResult {
  bool finished = false;
  int code = -1;
  double seconds = 0;
  std::string out;
};

// `kolo-run -np N --timeout ... --grace G fault_worker args...` with `env` added; kolo-run's own
// --timeout is the first limit, and ours (a few seconds later) the backstop if kolo-run hangs.
// `program` replaces fault_worker when given (its argv, e.g. a shell wrapping it).
// Starts `kolo-run -np N --timeout LIMIT --grace G [launcher_opts] fault_worker args...` with
// `env` added to the clean environment; the caller pumps and finishes it.
inline std::unique_ptr<Proc> start_kolo_run(int np, const std::vector<std::string>& launcher_opts,
                                            const std::vector<std::string>& worker_args,
                                            const std::vector<std::string>& env, double limit,
                                            double grace,
                                            const std::vector<std::string>& program = {},
                                            bool with_stdin = false) {
  std::vector<std::string> args = {KOLO_RUN_EXE,
                                   "-np",
                                   std::to_string(np),
                                   "--timeout",
                                   std::to_string(static_cast<int>(limit)),
                                   "--grace",
                                   std::to_string(static_cast<int>(grace))};
  args.insert(args.end(), launcher_opts.begin(), launcher_opts.end());
  if (program.empty()) {
    args.push_back(KOLO_FAULT_WORKER_EXE);
  } else {
    args.insert(args.end(), program.begin(), program.end());
  }
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  std::vector<std::string> e = clean_env();
  e.insert(e.end(), env.begin(), env.end());
  return std::make_unique<Proc>(args, e, -1, with_stdin);
}

// `kolo-run -np N --timeout ... --grace G fault_worker args...` with `env` added; kolo-run's own
// --timeout is the first limit, and ours (a few seconds later) the backstop if kolo-run hangs.
// `program` replaces fault_worker when given (its argv, e.g. a shell wrapping it).
inline JobResult kolo_run(int np, const std::vector<std::string>& worker_args,
                          const std::vector<std::string>& env, double limit = 30, double grace = 10,
                          const std::vector<std::string>& program = {}) {
  auto p = start_kolo_run(np, {}, worker_args, env, limit, grace, program);
  JobResult r;
  r.finished = finish_all({p.get()}, limit + 5);
  r.code = p->code();
  r.seconds = p->seconds();
  r.out = p->output();
  return r;
}

// The names in /dev/shm that kolo creates ("kolo-<token>-<rank>" and their ".bell"s): compared
// before and after a case, nothing may be left.
inline std::set<std::string> dev_shm_kolo() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("kolo-", 0) == 0) names.insert(f);
  }
  return names;
}

// A failed check for each kolo-* name in /dev/shm that `before` (dev_shm_kolo() at the start of
// a case) does not hold: whatever died, nothing may be left.
inline void check_no_new_dev_shm(const std::set<std::string>& before) {
  for (const auto& name : dev_shm_kolo()) {
    if (!before.count(name)) FAIL_CHECK("left in /dev/shm: " << name);
  }
}

inline std::uint16_t unused_port() {
  // Bound and closed again: the kernel hands out ephemeral ports in turn, so nobody takes it
  // back within the few seconds a case needs.
  kolo::net::Socket s = kolo::net::listen_tcp("127.0.0.1", 0);
  return kolo::net::local_port(s.fd());
}

struct RankEnv {
  std::vector<std::string> vars;  // added to clean_env()
  int listen_fd = -1;             // inherited as KOLO_LISTEN_FD (also closed here after fork)
};

// Starts one fault_worker per entry, directly (no launcher), with exactly the given contract.
inline std::vector<std::unique_ptr<Proc>> start_ranks(std::vector<RankEnv>& ranks,
                                                      const std::vector<std::string>& worker_args,
                                                      bool with_stdin = false) {
  std::vector<std::unique_ptr<Proc>> procs;
  for (auto& r : ranks) {
    std::vector<std::string> args = {KOLO_FAULT_WORKER_EXE};
    args.insert(args.end(), worker_args.begin(), worker_args.end());
    std::vector<std::string> env = clean_env();
    env.insert(env.end(), r.vars.begin(), r.vars.end());
    procs.push_back(std::make_unique<Proc>(args, env, r.listen_fd, with_stdin));
    if (r.listen_fd >= 0) {
      // Only the rank may hold its listener: while we keep a copy the port stays open.
      ::close(r.listen_fd);
      r.listen_fd = -1;
    }
  }
  return procs;
}

inline std::vector<Proc*> raw(const std::vector<std::unique_ptr<Proc>>& v) {
  std::vector<Proc*> out;
  for (auto& p : v) out.push_back(p.get());
  return out;
}

// The torchrun-style contract: rank 0 hosts the store at MASTER_ADDR:MASTER_PORT.
inline std::vector<RankEnv> torchrun_env(int np, std::uint16_t master_port,
                                         const std::string& secret,
                                         const std::vector<std::string>& extra) {
  std::vector<RankEnv> ranks(static_cast<std::size_t>(np));
  for (int r = 0; r < np; ++r) {
    auto& v = ranks[static_cast<std::size_t>(r)].vars;
    v = {"KOLO_RANK=" + std::to_string(r), "KOLO_SIZE=" + std::to_string(np),
         "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(master_port),
         "KOLO_SECRET=" + secret};
    v.insert(v.end(), extra.begin(), extra.end());
  }
  return ranks;
}

// Every rank exits non-zero having reported `kind` with a message containing the needles.
inline void expect_each(const std::vector<std::unique_ptr<Proc>>& procs, bool finished,
                        const std::string& kind, const std::vector<std::string>& needles,
                        double max_seconds) {
  for (std::size_t i = 0; i < procs.size(); ++i) {
    const Proc& p = *procs[i];
    CAPTURE(i);
    INFO("output of process " << i << ":\n" << p.output());
    REQUIRE_MESSAGE(finished, "the ranks did not finish in time");
    CHECK(p.code() == 3);
    const auto reports = fault_reports(p.output());
    REQUIRE(reports.size() == 1);
    const Report& r = reports.begin()->second;
    CHECK(r.kind == kind);
    for (const auto& n : needles) {
      CAPTURE(n);
      CHECK(contains(r.what, n));
    }
    CHECK(p.seconds() < max_seconds);
  }
}

// A connection attempt that does not retry: refused (true) or accepted/timed out (false).
inline bool connect_refused(std::uint16_t port) {
  kolo::net::Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return ::connect(s.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 &&
         errno == ECONNREFUSED;
}

inline kolo::net::Socket dial(std::uint16_t port, double seconds) {
  return kolo::net::connect_tcp("127.0.0.1", port, kolo::Deadline::after(seconds), "stranger");
}

// Reads until the other end closes (EOF or reset): true if that happens within `seconds`.
inline bool closed_by_peer(int fd, double seconds) {
  const auto dl = kolo::Deadline::after(seconds);
  for (;;) {
    char buf[256];
    const ssize_t k = ::recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return true;
    if (k > 0) continue;  // e.g. the challenge a rank sends every new connection
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, dl.remaining_ms()) == 0) return false;
  }
}

inline std::string random_bytes(std::size_t n) {
  std::mt19937 gen(12345);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen());
  return s;
}

inline void send_garbage(int fd) {
  const std::string g = random_bytes(256);
  kolo::net::send_all(fd, g.data(), g.size(), kolo::Deadline::after(5), "target");
}

// Every rank of an np-rank kolo-run job reports `kind` with a message containing all `needles`.
inline void expect_all_ranks(const JobResult& r, int np, const std::string& kind,
                             const std::vector<std::string>& needles) {
  INFO("kolo-run output:\n" << r.out);
  REQUIRE_MESSAGE(r.finished, "the job did not finish in time");
  CHECK(r.code == 3);  // the first failing rank's code: a kolo::Error was caught
  const auto reports = fault_reports(r.out);
  CHECK(static_cast<int>(reports.size()) == np);
  for (int rank = 0; rank < np; ++rank) {
    CAPTURE(rank);
    const auto it = reports.find(std::to_string(rank));
    REQUIRE_MESSAGE(it != reports.end(), "rank ", rank, " did not report an error");
    CHECK(it->second.kind == kind);
    for (const auto& n : needles) {
      CAPTURE(n);
      CHECK_MESSAGE(contains(it->second.what, n), it->second.what);
    }
  }
}

// ---------------------------------------------------------------- processes

inline double mono_now() {
  return std::chrono::duration<double>(WallClock::now().time_since_epoch()).count();
}

// State letter and process group of a live process from /proc/PID/stat; false if it is gone.
inline bool proc_stat(pid_t pid, char& state, pid_t& pgrp) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (!f) return false;
  char buf[1024] = {};
  const std::size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const std::string s(buf, n);
  const auto paren = s.rfind(')');  // the command name may contain spaces and parentheses
  if (paren == std::string::npos) return false;
  int ppid = 0, group = 0;
  if (std::sscanf(s.c_str() + paren + 1, " %c %d %d", &state, &ppid, &group) != 3) return false;
  pgrp = group;
  return true;
}

// Processes still running (zombies do not count: they hold nothing but a table entry) with
// process id `pid` or in process group `pgid`.
inline std::vector<pid_t> live_processes(pid_t pid, pid_t pgid) {
  std::vector<pid_t> out;
  DIR* d = ::opendir("/proc");
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long p = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || p <= 0) continue;
    char state = 0;
    pid_t group = 0;
    if (!proc_stat(static_cast<pid_t>(p), state, group) || state == 'Z' || state == 'X') continue;
    if (p == pid || (pgid > 0 && group == pgid)) out.push_back(static_cast<pid_t>(p));
  }
  ::closedir(d);
  return out;
}

// Resident set size of a process in KiB (VmRSS), -1 if unknown.
inline long rss_kib(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof(line), f)) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib;
}

// "KOLO_PID rank=R pid=P pgid=G store=S" lines of fault_worker, by rank.
struct RankProcess {
  pid_t pid = -1;
  pid_t pgid = -1;
  std::string store;
};

inline std::map<int, RankProcess> rank_processes(const std::string& out) {
  std::map<int, RankProcess> m;
  std::size_t pos = 0;
  while ((pos = out.find("KOLO_PID rank=", pos)) != std::string::npos) {
    const std::size_t eol = out.find('\n', pos);
    const std::string line = out.substr(pos, eol == std::string::npos ? eol : eol - pos);
    pos += 14;
    int rank = -1, pid = -1, pgid = -1;
    char store[256] = {};
    if (std::sscanf(line.c_str(), "KOLO_PID rank=%d pid=%d pgid=%d store=%255s", &rank, &pid, &pgid,
                    store) >= 3) {
      m[rank] = RankProcess{pid, pgid, store};
    }
  }
  return m;
}

// Waits (briefly) until none of the ranks' processes or process groups has a live member.
inline std::vector<pid_t> leftovers(const std::map<int, RankProcess>& ranks, double seconds) {
  const auto dl = kolo::Deadline::after(seconds);
  for (;;) {
    std::vector<pid_t> left;
    for (const auto& [rank, p] : ranks) {
      for (pid_t q : live_processes(p.pid, p.pgid)) left.push_back(q);
    }
    if (left.empty() || dl.expired()) return left;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// ---------------------------------------------------------------- SIGKILL trials

// The first rank a message names ("rank N"), -1 if none. kolo's peer-loss messages begin with
// the lost rank ("rank 2 (pid ...) exited or was killed during ...", "connection to rank 2 lost
// during ..."); the rank that detected or forwarded it comes later ("detected by rank 0",
// "[reported by rank 1]").
inline int first_rank_named(const std::string& what) {
  for (std::size_t p = what.find("rank "); p != std::string::npos; p = what.find("rank ", p + 1)) {
    const std::size_t d = p + 5;
    if (d < what.size() && what[d] >= '0' && what[d] <= '9') return std::atoi(what.c_str() + d);
  }
  return -1;
}

// One trial: np ranks of `fault_worker chaos SEED` (random collectives, every result checked)
// under kolo-run; once every rank is in its loop, wait a random 0..max_delay_ms and SIGKILL a
// random rank. Every survivor must raise PeerLostError naming the killed rank first (the
// documented outcome of a SIGKILL, docs/reliability.md), within detect_fraction of
// KOLO_TIMEOUT_SECONDS after the kill: the deadline is set far above any real detection time, so
// a survivor that missed the loss and ran into its deadline cannot pass. kolo-run must name the
// killed rank, and no process of any rank (process id or process group) may be left.
//
// KOLO_FAULT_SABOTAGE=timeout|late|blame (in the driver's environment) is handed to every rank
// as KOLO_TEST_SABOTAGE: the survivors then misreport the loss (fault_worker's header) and every
// trial must fail; it shows these checks can (faults/ "... reject survivors that misreport").
struct KillTrialSpec {
  int np = 4;
  std::string transport = "shm";
  std::vector<std::string> launcher_opts;  // e.g. -H ns1:2,ns2:2 --store-host ADDR
  std::vector<std::string> env;            // added to the job's environment
  double timeout = 30;                     // KOLO_TIMEOUT_SECONDS
  double detect_fraction = 0.25;           // every survivor's error within this * timeout
  std::string sabotage;                    // KOLO_TEST_SABOTAGE for the ranks; "" none
  std::uint64_t seed = 1;
  std::size_t max_elems = std::size_t{1} << 18;
  int max_delay_ms = 400;
};

struct KillTrialResult {
  KillTrialSpec spec;
  int victim = -1;
  int delay_ms = 0;
  double detect_max = -1;  // seconds from the kill to the last survivor's error
  std::map<std::string, int> kinds;
  std::vector<std::string> failures;  // empty: the trial passed
  std::string out;
};

inline KillTrialResult run_kill_trial(const KillTrialSpec& spec) {
  KillTrialResult res;
  res.spec = spec;
  std::mt19937_64 rng(spec.seed * 0x9e3779b97f4a7c15ull + 17);
  res.victim = static_cast<int>(rng() % static_cast<std::uint64_t>(spec.np));
  res.delay_ms = static_cast<int>(rng() % static_cast<std::uint64_t>(spec.max_delay_ms + 1));
  std::vector<std::string> env = spec.env;
  env.push_back("KOLO_TRANSPORT=" + spec.transport);
  char to[32];
  std::snprintf(to, sizeof(to), "%g", spec.timeout);
  env.push_back(std::string("KOLO_TIMEOUT_SECONDS=") + to);
  std::string sabotage = spec.sabotage;
  if (const char* v = std::getenv("KOLO_FAULT_SABOTAGE"); sabotage.empty() && v) sabotage = v;
  if (!sabotage.empty()) env.push_back("KOLO_TEST_SABOTAGE=" + sabotage);
  const double limit = spec.timeout + 40;
  auto job = start_kolo_run(
      spec.np, spec.launcher_opts,
      {"chaos", std::to_string(spec.seed), "0", std::to_string(spec.max_elems)}, env, limit,
      /*grace=*/spec.timeout + 10);
  auto fail = [&](const std::string& why) { res.failures.push_back(why); };
  const bool looping =
      pump({job.get()}, 30, [&] { return count_of(job->output(), "KOLO_LOOP rank=") == spec.np; });
  auto ranks = rank_processes(job->output());
  if (!looping || count_of(job->output(), "KOLO_LOOP rank=") != spec.np ||
      static_cast<int>(ranks.size()) != spec.np) {
    fail("the ranks did not all reach their loop");
    finish_all({job.get()}, 1);
    res.out = job->output();
    return res;
  }
  // The random point: pump output meanwhile, so no rank blocks on a full pipe.
  pump({job.get()}, res.delay_ms / 1000.0, [] { return false; });
  const pid_t victim_pid = ranks[res.victim].pid;
  const double t_kill = mono_now();
  ::kill(victim_pid, SIGKILL);
  const double detect_limit = spec.detect_fraction * spec.timeout;
  // Survivors that have not exited by twice their detection limit missed the loss: no need to
  // wait for their deadline (kolo-run's grace runs out later still).
  const bool finished = finish_all({job.get()}, 2 * detect_limit + 5);
  res.out = job->output();
  if (!finished) fail("kolo-run did not finish within 2 x the detection limit + 5 s (a hang)");
  if (contains(res.out, "KOLO_WRONG")) fail("a rank computed a wrong result");
  if (contains(res.out, "KOLO_NOERROR")) fail("a rank ran on without an error");
  if (!contains(res.out, "rank " + std::to_string(res.victim) + " killed by signal 9")) {
    fail("kolo-run did not report the SIGKILL of rank " + std::to_string(res.victim));
  }
  const auto reports = fault_reports(res.out);
  if (reports.count(std::to_string(res.victim))) fail("the killed rank reported an error");
  for (int r = 0; r < spec.np; ++r) {
    if (r == res.victim) continue;
    const auto it = reports.find(std::to_string(r));
    if (it == reports.end()) {
      fail("survivor " + std::to_string(r) + " did not report an error");
      continue;
    }
    const Report& rep = it->second;
    ++res.kinds[rep.kind];
    const std::string who = "survivor " + std::to_string(r);
    if (rep.kind != "PeerLostError") {
      fail(who + " raised " + rep.kind + ", not PeerLostError: " + rep.what);
    }
    if (first_rank_named(rep.what) != res.victim) {
      fail(who + " did not name the killed rank " + std::to_string(res.victim) +
           " first: " + rep.what);
    }
    const double detect = rep.mono - t_kill;
    res.detect_max = std::max(res.detect_max, detect);
    if (rep.mono < 0 || detect > detect_limit) {
      fail(who + " raised " + std::to_string(detect) +
           " s after the kill (limit: " + std::to_string(spec.detect_fraction) +
           " x KOLO_TIMEOUT_SECONDS = " + std::to_string(detect_limit) + " s)");
    }
  }
  const auto left = leftovers(ranks, 3);
  for (pid_t p : left) fail("process " + std::to_string(p) + " of the job is still running");
  return res;
}

// Trials of `specs`, `parallel` at a time (each trial is its own kolo-run job).
inline std::vector<KillTrialResult> run_kill_trials(const std::vector<KillTrialSpec>& specs,
                                                    int parallel) {
  std::vector<KillTrialResult> results(specs.size());
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> workers;
  for (int w = 0; w < std::max(1, parallel); ++w) {
    workers.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < specs.size();) {
        results[i] = run_kill_trial(specs[i]);
      }
    });
  }
  for (auto& t : workers) t.join();
  return results;
}

inline long env_long(const char* name, long dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atol(v) : dflt;
}

// KOLO_FAULT_SEED fixes the trials' seeds (to replay a failure); else a fresh one per run.
inline std::uint64_t base_seed() {
  if (const char* v = std::getenv("KOLO_FAULT_SEED"); v && *v) return std::strtoull(v, nullptr, 10);
  return std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32);
}

// Checks every trial (its output in the failure message) and reports the detection times.
inline void check_kill_trials(const std::vector<KillTrialResult>& results, const char* what) {
  double worst = 0, sum = 0;
  int n = 0;
  std::map<std::string, int> kinds;
  for (const auto& r : results) {
    CAPTURE(r.spec.seed);
    CAPTURE(r.victim);
    CAPTURE(r.delay_ms);
    INFO("trial output:\n" << r.out);
    for (const auto& f : r.failures) CHECK_MESSAGE(false, f);
    if (r.failures.empty()) {
      worst = std::max(worst, r.detect_max);
      sum += r.detect_max;
      ++n;
    }
    for (const auto& [k, c] : r.kinds) kinds[k] += c;
  }
  std::string k;
  for (const auto& [name, c] : kinds) k += " " + name + "=" + std::to_string(c);
  char line[256];
  std::snprintf(line, sizeof(line),
                "%s: %zu trials, %d passed; detection (kill -> last survivor's error): mean %.3f "
                "s, max %.3f s; survivors:%s",
                what, results.size(), n, n ? sum / n : 0.0, worst, k.c_str());
  MESSAGE(line);
  if (std::getenv("KOLO_FAULTS_VERBOSE")) std::fprintf(stderr, "%s\n", line);
}

// ---------------------------------------------------------------- relay

// A TCP relay between a listening address and a target, for putting something into a data
// path: every chunk read from one side is written to the other `delay` seconds later (a link
// with that one-way latency and no bandwidth limit; at most 4 MiB queued per direction, then
// it stops reading: TCP flow control reaches the sender). Optionally records the first bytes
// each client sent (for replay attacks). One thread, one poll loop; stops in the destructor.
class Relay {
 public:
  struct Route {
    std::string listen_host;
    std::uint16_t listen_port = 0;  // 0: any
    std::string target_host;
    std::uint16_t target_port = 0;
  };

  // `delay_bytes`: only the first so many bytes of each direction of a connection are delayed
  // (e.g. just the handshake), the rest passes at once (behind them, in order).
  Relay(const std::vector<Route>& routes, double delay_seconds, std::size_t record_bytes = 0,
        std::size_t delay_bytes = SIZE_MAX)
      : delay_(std::chrono::duration_cast<WallClock::duration>(
            std::chrono::duration<double>(delay_seconds))),
        record_bytes_(record_bytes),
        delay_bytes_(delay_bytes) {
    for (const auto& r : routes) {
      Listener l;
      l.sock = kolo::net::listen_tcp(r.listen_host, r.listen_port);
      kolo::net::set_nonblocking(l.sock.fd(), true);
      l.route = r;
      l.route.listen_port = kolo::net::local_port(l.sock.fd());
      listeners_.push_back(std::move(l));
    }
    int p[2];
    REQUIRE(::pipe2(p, O_CLOEXEC | O_NONBLOCK) == 0);
    wake_r_ = kolo::net::Socket(p[0]);
    wake_w_ = kolo::net::Socket(p[1]);
    thread_ = std::thread([this] { loop(); });
  }

  Relay(const Relay&) = delete;
  Relay& operator=(const Relay&) = delete;

  ~Relay() {
    stop_.store(true);
    const char b = 1;
    [[maybe_unused]] const ssize_t k = ::write(wake_w_.fd(), &b, 1);
    thread_.join();
  }

  std::uint16_t port(std::size_t i) const { return listeners_[i].route.listen_port; }
  std::uint64_t bytes() const { return bytes_.load(); }
  int connections() const { return connections_.load(); }
  std::vector<std::string> recorded() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recorded_;
  }

 private:
  struct Listener {
    kolo::net::Socket sock;
    Route route;
  };
  struct Chunk {
    WallClock::time_point due;
    std::string data;
    std::size_t off = 0;
  };
  struct Dir {  // one direction: read from `from`, write to `to`
    std::deque<Chunk> q;
    std::size_t queued = 0;
    bool eof = false;      // `from` closed its sending side
    bool shut = false;     // we closed `to`'s sending side after the queue drained
    std::size_t seen = 0;  // bytes read so far
  };
  struct Pair {
    kolo::net::Socket a, b;  // a: the client, b: the target
    Dir ab, ba;
    std::size_t record_slot = 0;
    bool dead = false;
  };
  static constexpr std::size_t kMaxQueued = std::size_t{4} << 20;

  void accept_on(const Listener& l) {
    for (;;) {
      const int fd = ::accept4(l.sock.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) return;
      auto p = std::make_unique<Pair>();
      p->a = kolo::net::Socket(fd);
      try {
        p->b = kolo::net::connect_tcp(l.route.target_host, l.route.target_port,
                                      kolo::Deadline::after(5), "relay target");
      } catch (const kolo::Error&) {
        continue;  // the client sees its connection closed
      }
      kolo::net::set_nonblocking(p->b.fd(), true);
      kolo::net::set_nodelay(p->a.fd());
      {
        std::lock_guard<std::mutex> lock(mu_);
        p->record_slot = recorded_.size();
        recorded_.emplace_back();
      }
      ++connections_;
      pairs_.push_back(std::move(p));
    }
  }

  // Reads what `from` has into the direction's queue; false if the pair is finished.
  bool read_side(Pair& p, int from, Dir& d, bool record) {
    while (d.queued < kMaxQueued) {
      std::string buf(256 * 1024, '\0');
      const ssize_t k = ::recv(from, buf.data(), buf.size(), MSG_DONTWAIT);
      if (k > 0) {
        buf.resize(static_cast<std::size_t>(k));
        if (record && record_bytes_ > 0) {
          std::lock_guard<std::mutex> lock(mu_);
          std::string& r = recorded_[p.record_slot];
          if (r.size() < record_bytes_) r += buf.substr(0, record_bytes_ - r.size());
        }
        const bool delayed = d.seen < delay_bytes_;
        d.seen += buf.size();
        d.queued += buf.size();
        d.q.push_back(Chunk{WallClock::now() + (delayed ? delay_ : WallClock::duration::zero()),
                            std::move(buf), 0});
        continue;
      }
      if (k == 0) {
        d.eof = true;
        return true;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return false;  // reset: close both sides
    }
    return true;
  }

  bool write_side(int to, Dir& d) {
    const auto now = WallClock::now();
    while (!d.q.empty() && d.q.front().due <= now) {
      Chunk& c = d.q.front();
      const ssize_t k =
          ::send(to, c.data.data() + c.off, c.data.size() - c.off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k > 0) {
        c.off += static_cast<std::size_t>(k);
        d.queued -= static_cast<std::size_t>(k);
        bytes_ += static_cast<std::uint64_t>(k);
        if (c.off == c.data.size()) d.q.pop_front();
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      return false;
    }
    if (d.eof && d.q.empty() && !d.shut) {
      ::shutdown(to, SHUT_WR);
      d.shut = true;
    }
    return true;
  }

  void loop() {
    std::vector<pollfd> fds;
    for (;;) {
      if (stop_.load()) return;
      fds.clear();
      fds.push_back({wake_r_.fd(), POLLIN, 0});
      for (const auto& l : listeners_) fds.push_back({l.sock.fd(), POLLIN, 0});
      auto wake_at = WallClock::now() + std::chrono::milliseconds(100);
      for (const auto& p : pairs_) {
        auto events = [&](const Dir& in, const Dir& out) {
          short ev = 0;
          if (!in.eof && in.queued < kMaxQueued) ev |= POLLIN;
          if (!out.q.empty()) {
            if (out.q.front().due <= WallClock::now()) {
              ev |= POLLOUT;
            } else {
              wake_at = std::min(wake_at, out.q.front().due);
            }
          }
          return ev;
        };
        fds.push_back({p->a.fd(), events(p->ab, p->ba), 0});
        fds.push_back({p->b.fd(), events(p->ba, p->ab), 0});
      }
      const auto wait =
          std::chrono::duration_cast<std::chrono::microseconds>(wake_at - WallClock::now());
      const int ms = static_cast<int>(std::max<long long>(0, (wait.count() + 999) / 1000));
      if (::poll(fds.data(), fds.size(), ms) < 0 && errno != EINTR) return;
      if (fds[0].revents) {
        char b[16];
        while (::read(wake_r_.fd(), b, sizeof(b)) > 0) {
        }
      }
      for (std::size_t i = 0; i < listeners_.size(); ++i) {
        if (fds[1 + i].revents & POLLIN) accept_on(listeners_[i]);
      }
      for (auto& p : pairs_) {
        bool ok = read_side(*p, p->a.fd(), p->ab, true) && read_side(*p, p->b.fd(), p->ba, false);
        ok = ok && write_side(p->b.fd(), p->ab) && write_side(p->a.fd(), p->ba);
        if (!ok || (p->ab.shut && p->ba.shut)) p->dead = true;
      }
      std::erase_if(pairs_, [](const std::unique_ptr<Pair>& p) { return p->dead; });
    }
  }

  WallClock::duration delay_;
  std::size_t record_bytes_;
  std::size_t delay_bytes_;
  std::vector<Listener> listeners_;
  std::vector<std::unique_ptr<Pair>> pairs_;
  kolo::net::Socket wake_r_, wake_w_;
  std::atomic<bool> stop_{false};
  std::atomic<std::uint64_t> bytes_{0};
  std::atomic<int> connections_{0};
  mutable std::mutex mu_;
  std::vector<std::string> recorded_;
  std::thread thread_;
};

}  // namespace kolo_faults
