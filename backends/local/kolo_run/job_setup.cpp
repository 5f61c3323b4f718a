// kolo-run's job, set up: signals through a signalfd, paths, ssh options, the store and its secret,
// each rank's environment, and spawning a rank (here with its watchdog, in a netns, or over ssh).

#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/net/auth.hpp"
#include "kolo_run/common.hpp"
#include "kolo_run/job.hpp"
#include "kolo_run/ssh.hpp"
#include "rank_watchdog.hpp"

extern char** environ;

namespace kolo_run {

int Job::run() {
  setup_signals();
  prepare_output();
  resolve_paths();
  start_store();
  prepare_env();
  ranks_.reserve(static_cast<std::size_t>(o_.np));  // the poll loop holds Rank pointers
  for (int r = 0; r < o_.np; ++r) unspawned_.push_back(r);
  spawn_ready();
  if (o_.timeout) timeout_deadline_ = kolo::Deadline::after(*o_.timeout);
  loop();
  store_->stop();
  if (timed_out_) return kExitTimeout;
  if (first_failure_) return *first_failure_;
  if (interrupt_signal_) return 128 + interrupt_signal_;
  return 0;
}

void Job::setup_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&set, s);
  if (::sigprocmask(SIG_BLOCK, &set, &orig_mask_) != 0) {
    throw LaunchError(std::string("sigprocmask failed: ") + std::strerror(errno), kExitInternal);
  }
  sigfd_ = ::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sigfd_ < 0) {
    throw LaunchError(std::string("signalfd failed: ") + std::strerror(errno), kExitInternal);
  }
  // A reader closing our stdout must not kill the launcher of a running job.
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &orig_sigpipe_);
}

void Job::resolve_paths() {
  auto first_of = [&](HostKind k) -> const RankPlan* {
    for (const auto& p : plan_) {
      if (p.kind == k) return &p;
    }
    return nullptr;
  };
  const RankPlan* ssh_rank = first_of(HostKind::ssh);
  const bool any_here = std::any_of(plan_.begin(), plan_.end(),
                                    [](const RankPlan& p) { return p.kind != HostKind::ssh; });
  // The program must exist here only when ranks run here; ssh hosts look for it themselves.
  program_ = any_here ? resolve_program(o_.command[0]) : o_.command[0];
  if (ssh_rank) prepare_ssh(*ssh_rank, any_here);
  const bool any_netns = std::any_of(plan_.begin(), plan_.end(),
                                     [](const RankPlan& p) { return p.kind == HostKind::netns; });
  if (any_netns) {
    if (!o_.store_host) {
      std::string ns;
      for (const auto& p : plan_) {
        if (p.kind == HostKind::netns) {
          ns = p.host_key;
          break;
        }
      }
      throw LaunchError(
          "host " + ns +
              " is a network namespace, which cannot reach a store on 127.0.0.1: pass "
              "--store-host ADDR with an address of this machine reachable from it",
          kExitUsage);
    }
    ip_ = find_ip_command();
  }
}

void Job::prepare_ssh(const RankPlan& ssh_rank, bool any_here) {
  const std::string& host = ssh_rank.host_key;
  if (any_here && !o_.store_host) {
    // A rank here would reach the store on 127.0.0.1 and then advertise 127.0.0.1 to peers
    // on other machines.
    throw LaunchError("ranks run on this machine and on ssh host " + host +
                          ": pass --store-host ADDR, an address of this machine that " + host +
                          " reaches (the ranks here advertise the address they reach the "
                          "store by)",
                      kExitUsage);
  }
  const std::string what = o_.ssh ? "--ssh" : "KOLO_RUN_SSH";
  const std::string line = o_.ssh ? *o_.ssh : getenv_or("KOLO_RUN_SSH", "ssh");
  try {
    ssh_words_ = split_words(line, what + " '" + line + "'");
  } catch (const UsageError& e) {
    throw LaunchError(e.what(), kExitUsage);
  }
  if (ssh_words_.empty()) {
    throw LaunchError(what + " is empty: it must name the ssh command", kExitUsage);
  }
  try {
    ssh_words_[0] = resolve_program(ssh_words_[0]);
  } catch (const LaunchError& e) {
    throw LaunchError("host " + host + " is not this machine nor a network namespace, so its " +
                          "ranks start with ssh, but " + e.what(),
                      e.code());
  }
  // ssh's own defaults for a launcher: no terminal, never a prompt (a rank's ssh cannot
  // answer one), a bounded connect. Given after the user's words: ssh keeps the first value
  // of an option, so the user's win. Other remote shells (--ssh "rsh") get nothing added.
  const std::string base = ssh_words_[0].substr(ssh_words_[0].rfind('/') + 1);
  if (base == "ssh") {
    for (const char* w : {"-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=30"}) {
      ssh_words_.emplace_back(w);
    }
  }
  // (Another remote shell may well run on this machine: then loopback is its business.)
  if (base == "ssh" && o_.store_host && is_loopback(*o_.store_host)) {
    throw LaunchError("--store-host " + *o_.store_host +
                          " is a loopback address, which ranks on ssh host " + host +
                          " cannot reach: give an address of this machine that " + host +
                          " reaches, or leave --store-host out",
                      kExitUsage);
  }
  char cwd[4096];
  wdir_ = ::getcwd(cwd, sizeof(cwd)) ? cwd : "";
}

void Job::start_store() {
  const bool all_local = std::all_of(plan_.begin(), plan_.end(), [](const RankPlan& p) {
    return p.kind == HostKind::this_machine;
  });
  // Loopback keeps a single-machine job's store invisible to the network; ranks in other
  // namespaces need it on every interface.
  std::string bind = "127.0.0.1";
  if (!all_local || (o_.store_host && !is_loopback(*o_.store_host))) {
    bind = o_.store_host && o_.store_host->find(':') != std::string::npos ? "::" : "0.0.0.0";
  }
  secret_ = kolo::net::generate_secret();
  try {
    store_ = kolo::StoreServer::listen(bind, 0, secret_);
  } catch (const std::exception& e) {
    throw LaunchError(std::string("cannot start the rendezvous store on ") + bind + ": " + e.what(),
                      kExitInternal);
  }
  const std::string host = o_.store_host.value_or("127.0.0.1");
  const std::string shown = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  store_addr_ = shown + ":" + std::to_string(store_->port());
}

void Job::prepare_env() {
  // Variables kolo-run sets per rank replace inherited ones. KOLO_PEERS and KOLO_LISTEN_FD
  // describe the job kolo-run itself may be part of (a stale fd number, another job's
  // peers) and would mislead the ranks, so they are dropped.
  // -x NAME=VALUE replaces an inherited NAME.
  std::set<std::string> set_by_x;
  for (const auto& x : o_.exports) {
    if (x.find('=') != std::string::npos) set_by_x.insert(x.substr(0, x.find('=')));
  }
  for (char** e = environ; *e; ++e) {
    const std::string_view kv(*e);
    const std::string name(kv.substr(0, kv.find('=')));
    if (is_contract_variable(name) || set_by_x.count(name)) continue;
    base_env_.emplace_back(kv);
    // ssh ranks start from the remote login's environment: kolo's own knobs follow them
    // (KOLO_TIMEOUT_SECONDS, KOLO_TRANSPORT, ...), except this machine's address and the
    // launcher's own setting.
    if (name.rfind("KOLO_", 0) == 0 && name != "KOLO_ADDR" && name != "KOLO_RUN_SSH") {
      ssh_env_.emplace_back(kv);
    }
  }
  for (const auto& x : o_.exports) {
    if (x.find('=') != std::string::npos) {
      base_env_.push_back(x);
      ssh_env_.push_back(x);
      continue;
    }
    const char* v = std::getenv(x.c_str());
    if (!v) throw LaunchError("-x " + x + ": " + x + " is not set in this environment", kExitUsage);
    ssh_env_.push_back(x + "=" + v);
  }
  if (!ssh_words_.empty()) {
    for (const auto& kv : ssh_env_) {
      if (kv.find('\n') != std::string::npos) {
        throw LaunchError("the value of " + kv.substr(0, kv.find('=')) +
                              " has a newline, which cannot be passed to ssh hosts",
                          kExitUsage);
      }
    }
  }
  devnull_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  // Ranks run in their own process groups, so a rank reading a terminal would be stopped by
  // SIGTTIN; rank 0 therefore gets stdin only when it is not a terminal (a file or pipe).
  rank0_stdin_ = ::isatty(STDIN_FILENO) ? devnull_ : STDIN_FILENO;
}

std::vector<std::string> Job::env_for(int r) const {
  const RankPlan& p = plan_[static_cast<std::size_t>(r)];
  std::vector<std::string> env = base_env_;
  auto add = [&](const char* k, const std::string& v) { env.push_back(std::string(k) + "=" + v); };
  add("KOLO_RANK", std::to_string(r));
  add("KOLO_SIZE", std::to_string(o_.np));
  add("KOLO_LOCAL_RANK", std::to_string(p.local_rank));
  add("KOLO_LOCAL_SIZE", std::to_string(p.local_size));
  add("KOLO_CROSS_RANK", std::to_string(p.cross_rank));
  add("KOLO_CROSS_SIZE", std::to_string(p.cross_size));
  add("KOLO_STORE", store_addr_);
  add("KOLO_SECRET", secret_);
  add("KOLO_HOST_KEY", p.host_key);
  return env;
}

std::string Job::job_line(int r) const {
  const RankPlan& p = plan_[static_cast<std::size_t>(r)];
  std::string line = "export";
  auto add = [&](const std::string& kv) { line += " " + sh_quote(kv); };
  for (const auto& kv : ssh_env_) add(kv);
  add("KOLO_RANK=" + std::to_string(r));
  add("KOLO_SIZE=" + std::to_string(o_.np));
  add("KOLO_LOCAL_RANK=" + std::to_string(p.local_rank));
  add("KOLO_LOCAL_SIZE=" + std::to_string(p.local_size));
  add("KOLO_CROSS_RANK=" + std::to_string(p.cross_rank));
  add("KOLO_CROSS_SIZE=" + std::to_string(p.cross_size));
  if (o_.store_host) add("KOLO_STORE=" + store_addr_);
  add("KOLO_SECRET=" + secret_);
  add("KOLO_HOST_KEY=" + p.host_key);
  // Without --store-host, the prologue exports no KOLO_STORE of its own making unless unset:
  // an inherited one from the remote login must not win.
  if (!o_.store_host) line = "unset KOLO_STORE; " + line;
  line += "; kolo_port=" + std::to_string(store_->port()) + "; kolo_host=" + sh_quote(p.host_key) +
          "; kolo_wdir=" + sh_quote(wdir_) + "\n";
  return line;
}

void Job::close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

void Job::spawn(int r) {
  const RankPlan& p = plan_[static_cast<std::size_t>(r)];
  // Everything the child needs is built here: between fork and exec only async-signal-safe
  // calls are allowed (the store's threads may hold the allocator's locks).
  const bool ssh = p.kind == HostKind::ssh;
  std::vector<std::string> args;
  std::vector<std::string> env;
  std::string job;
  if (ssh) {
    // ssh [user's words] [defaults] host "exec /bin/sh -c '<prologue>' kolo-rank 'prog' 'arg'..."
    // The ssh client gets this environment without the contract: the secret goes down the pipe.
    args = ssh_words_;
    args.push_back(ssh_destination(p.host_key));
    std::string remote = "exec /bin/sh -c " + sh_quote(kRemotePrologue) + " kolo-rank";
    for (const auto& a : o_.command) remote += " " + sh_quote(a);
    args.push_back(remote);
    env = base_env_;
    job = job_line(r);
    if (job.size() > 60000) {
      throw LaunchError("the environment passed to ssh hosts is " + std::to_string(job.size()) +
                            " bytes, more than the 60000 kolo-run sends: forward less (-x)",
                        kExitUsage);
    }
  } else {
    if (p.kind == HostKind::netns) args = {ip_, "netns", "exec", p.host_key};
    args.push_back(program_);
    args.insert(args.end(), o_.command.begin() + 1, o_.command.end());
    env = env_for(r);
  }
  const std::string exe = args[0];
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  // Ranks here start through a watchdog (rank_watchdog.hpp) that reports on a socket; ssh
  // ranks are kolo-run's own children (their remote prologue is their watchdog).
  int out[2] = {-1, -1}, err[2] = {-1, -1}, status_pipe[2] = {-1, -1}, ctl[2] = {-1, -1};
  int chan[2] = {-1, -1};
  auto close_all = [&] {
    for (int* p : {out, err, status_pipe, ctl, chan}) {
      close_fd(p[0]);
      close_fd(p[1]);
    }
  };
  const bool made = ::pipe2(out, O_CLOEXEC) == 0 && ::pipe2(err, O_CLOEXEC) == 0 &&
                    (ssh ? ::pipe2(status_pipe, O_CLOEXEC) == 0 && ::pipe2(ctl, O_CLOEXEC) == 0
                         : ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, chan) == 0);
  if (!made) {
    const int e = errno;
    close_all();
    throw LaunchError("cannot create pipes for rank " + std::to_string(r) + ": " +
                          std::strerror(e) + " (errno " + std::to_string(e) + ")",
                      kExitInternal);
  }
  const int in_fd = ssh ? ctl[0] : r == 0 ? rank0_stdin_ : devnull_;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int e = errno;
    close_all();
    throw LaunchError("cannot start rank " + std::to_string(r) + ": fork failed: " +
                          std::strerror(e) + " (errno " + std::to_string(e) + ")",
                      kExitInternal);
  }
  if (pid == 0 && !ssh) {
    const kolo_run::WatchdogSpec spec{
        in_fd,          out[1],
        err[1],         chan[1],
        exe.c_str(),    argv.data(),
        envp.data(),    &orig_mask_,
        &orig_sigpipe_, static_cast<int>(kKillAfterTermSeconds * 1000)};
    kolo_run::run_watchdog(spec);
  }
  if (pid == 0) {
    // Own process group: kolo-run signals the rank together with whatever it starts.
    ::setpgid(0, 0);
    // Die with kolo-run, whatever kills it. (The signal follows the death of the forking
    // *thread*; this is the main thread, which lives as long as kolo-run.) The remote side
    // sees its ssh session end and SIGKILLs the rank's group there.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kExitInternal);  // kolo-run died before prctl
    auto to = [](int fd, int target) {
      if (fd == target) {
        ::fcntl(fd, F_SETFD, 0);  // dup2 onto itself would keep O_CLOEXEC
      } else {
        ::dup2(fd, target);
      }
    };
    to(in_fd, STDIN_FILENO);
    to(out[1], STDOUT_FILENO);
    to(err[1], STDERR_FILENO);
    ::sigprocmask(SIG_SETMASK, &orig_mask_, nullptr);
    ::sigaction(SIGPIPE, &orig_sigpipe_, nullptr);
    ::execve(exe.c_str(), argv.data(), envp.data());
    const int e = errno;
    [[maybe_unused]] ssize_t k = ::write(status_pipe[1], &e, sizeof(e));
    ::_exit(e == ENOENT ? kExitNotFound : kExitNotExecutable);
  }
  if (ssh) ::setpgid(pid, pid);  // also from here, so kill(-pid) works whichever runs first
  close_fd(out[1]);
  close_fd(err[1]);
  close_fd(status_pipe[1]);
  close_fd(chan[1]);
  if (ssh) {
    close_fd(ctl[0]);
    // The job line fits in the pipe (at most 60000 bytes of its 64 KiB), so this returns at
    // once whatever ssh does; later control lines are written without blocking.
    std::string_view rest = job;
    while (!rest.empty()) {
      const ssize_t k = ::write(ctl[1], rest.data(), rest.size());
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;  // ssh already gone: its exit status tells the rest
      rest.remove_prefix(static_cast<std::size_t>(k));
    }
    ::fcntl(ctl[1], F_SETFL, O_NONBLOCK);
  }

  Rank rank;
  rank.index = r;
  rank.pid = ssh ? pid : -1;
  rank.watchdog = ssh ? -1 : pid;
  rank.alive = ssh;
  rank.kind = p.kind;
  rank.host = p.host_key;
  rank.out_fd = out[0];
  rank.err_fd = err[0];
  rank.ctl_fd = ctl[1];
  rank.chan_fd = chan[0];
  rank.starting = ssh;
  const std::string prefix = o_.prefix ? "[" + std::to_string(r) + "] " : std::string();
  rank.out = std::make_unique<LineRelay>(g_stdout, prefix);
  rank.err = std::make_unique<LineRelay>(g_stderr, prefix);
  ::fcntl(rank.out_fd, F_SETFL, O_NONBLOCK);
  ::fcntl(rank.err_fd, F_SETFL, O_NONBLOCK);
  ranks_.push_back(std::move(rank));
  Rank& added = ranks_.back();

  // ssh: the status pipe closes on a successful exec (O_CLOEXEC) or carries exec's errno.
  // Here: the watchdog's first message carries the rank's pid and exec's errno.
  int exec_errno = 0;
  if (ssh) {
    ssize_t k;
    do {
      k = ::read(status_pipe[0], &exec_errno, sizeof(exec_errno));
    } while (k < 0 && errno == EINTR);
    close_fd(status_pipe[0]);
    if (k != static_cast<ssize_t>(sizeof(exec_errno))) exec_errno = 0;
  } else {
    kolo_run::WatchdogMsg m{};
    std::size_t got = 0;
    while (got < sizeof(m)) {
      const ssize_t k = ::read(added.chan_fd, reinterpret_cast<char*>(&m) + got, sizeof(m) - got);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      got += static_cast<std::size_t>(k);
    }
    if (got < sizeof(m) || m.kind != kolo_run::kMsgStarted) {
      throw LaunchError("cannot start rank " + std::to_string(r) +
                            ": its watchdog process ended before starting it",
                        kExitInternal);
    }
    if (m.a <= 0) {
      throw LaunchError("cannot start rank " + std::to_string(r) + ": fork failed: " +
                            std::strerror(m.b) + " (errno " + std::to_string(m.b) + ")",
                        kExitInternal);
    }
    added.pid = m.a;
    added.alive = true;
    exec_errno = m.b;
    ::fcntl(added.chan_fd, F_SETFL, O_NONBLOCK);
  }
  if (exec_errno != 0) {
    throw LaunchError("cannot execute '" + exe + "' for rank " + std::to_string(r) + ": " +
                          std::strerror(exec_errno),
                      exec_errno == ENOENT ? kExitNotFound : kExitNotExecutable);
  }
}

void Job::kill_group(const Rank& r, int sig) {
  if (r.pid > 0) ::kill(-r.pid, sig);  // ESRCH is fine: the group is already empty
}

void Job::wait_watchdogs() {
  for (auto& r : ranks_) {
    close_fd(r.chan_fd);
    if (r.watchdog > 0) {
      while (::waitpid(r.watchdog, nullptr, 0) < 0 && errno == EINTR) {
      }
      r.watchdog = -1;
    }
  }
}

}  // namespace kolo_run
