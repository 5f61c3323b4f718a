// kolo-run's job, run: the poll loop over the ranks' pipes, watchdog channels and the signalfd;
// output relay with back-pressure, rank exits and the first failure, grace -> SIGTERM -> SIGKILL,
// signals forwarded to ranks (ssh ones over their control line), --timeout.

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

void Job::loop() {
  // What each pollfd after the signalfd is: a rank's stdout/stderr pipe, a watchdog's socket,
  // or one of kolo-run's own output streams waiting to take more.
  enum class Src { out, err, chan, stream };
  struct Owner {
    Rank* rank;
    Src src;
    OutStream* stream;
  };
  std::vector<pollfd> fds;
  std::vector<Owner> owners;
  while (!unspawned_.empty() ||
         std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.alive; })) {
    fds.clear();
    owners.clear();
    fds.push_back({sigfd_, POLLIN, 0});
    for (auto& r : ranks_) {
      // A stream that holds kOutBuffer bytes is not fed more: its ranks wait (back-pressure),
      // kolo-run does not.
      if (r.out_fd >= 0 && !r.out->full()) {
        fds.push_back({r.out_fd, POLLIN, 0});
        owners.push_back({&r, Src::out, nullptr});
      }
      if (r.err_fd >= 0 && !r.err->full()) {
        fds.push_back({r.err_fd, POLLIN, 0});
        owners.push_back({&r, Src::err, nullptr});
      }
      if (r.chan_fd >= 0) {
        fds.push_back({r.chan_fd, POLLIN, 0});
        owners.push_back({&r, Src::chan, nullptr});
      }
    }
    for (OutStream* s : {g_stdout, g_stderr}) {
      if (s->pending() > 0 && !(s == g_stderr && g_stderr == g_stdout)) {
        fds.push_back({s->poll_fd(), POLLOUT, 0});
        owners.push_back({nullptr, Src::stream, s});
      }
    }
    const int rc = ::poll(fds.data(), fds.size(), next_timeout_ms());
    if (rc < 0 && errno != EINTR) {
      throw LaunchError(std::string("poll failed: ") + std::strerror(errno), kExitInternal);
    }
    if (rc > 0) {
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        const Owner& o = owners[i - 1];
        if (o.src == Src::stream) {
          o.stream->flush();
        } else if (o.src != Src::chan) {  // the sockets are read by reap()
          read_some(*o.rank, o.src == Src::err, 1);
        }
      }
      if (fds[0].revents != 0) handle_signals();
    }
    reap();  // also without SIGCHLD: signalfd merges signals, reaping is idempotent
    check_deadlines();
    spawn_ready();
  }
  // Every rank is gone: what they wrote is already in the pipes. Anything a leftover
  // grandchild writes later is not waited for (it could hold the pipe open for ever), nor a
  // reader that takes nothing for kFlushStallSeconds (then the rest is dropped, counted).
  const double stall = timed_out_ || interrupt_signal_ ? kFlushStallTornDown : kFlushStallSeconds;
  bool gave_up = false;
  for (int round = 0; round < 256 && !gave_up; ++round) {
    bool read_any = false;
    bool blocked = false;
    for (auto& r : ranks_) {
      for (const bool is_err : {false, true}) {
        if ((is_err ? r.err_fd : r.out_fd) < 0) continue;
        if ((is_err ? r.err : r.out)->full()) {
          blocked = true;
        } else {
          read_any = read_some(r, is_err, 1) > 0 || read_any;
        }
      }
    }
    if (!read_any && !blocked) break;
    if (blocked) gave_up = !flush_output(stall, sigfd_);
  }
  for (auto& r : ranks_) {
    r.out->finish();
    r.err->finish();
    close_fd(r.out_fd);
    close_fd(r.err_fd);
    close_fd(r.ctl_fd);
  }
  if (!flush_output(gave_up ? 0.0 : stall, sigfd_)) drop_output();
  if (phase_ != Phase::running) {
    // A torn-down job leaves nothing behind: the groups may still hold helpers the ranks
    // started.
    for (auto& r : ranks_) kill_group(r, SIGKILL);
  }
  // The watchdogs release what the ranks left (SIGTERM, then SIGKILL) and exit.
  wait_watchdogs();
}

int Job::read_some(Rank& r, bool is_err, int max_reads) {
  int& fd = is_err ? r.err_fd : r.out_fd;
  LineRelay& relay = is_err ? *r.err : *r.out;
  char buf[65536];
  int got = 0;
  for (int n = 0; fd >= 0 && n < max_reads && !relay.full(); ++n) {
    const ssize_t k = ::read(fd, buf, sizeof(buf));
    if (k > 0) {
      ++got;
      if (!is_err && r.starting) {
        feed_before_start(r, buf, static_cast<std::size_t>(k));
      } else {
        relay.feed(buf, static_cast<std::size_t>(k));
      }
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return got;
    if (!is_err && r.starting) {  // the session ended before the prologue spoke
      r.starting = false;
      relay.feed(r.before_start.data(), r.before_start.size());
      r.before_start.clear();
    }
    relay.finish();  // EOF (or a broken pipe): flush a partial last line
    close_fd(fd);
    return got;
  }
  return got;
}

void Job::feed_before_start(Rank& r, const char* data, std::size_t n) {
  std::string& b = r.before_start;
  b.append(data, n);
  std::size_t start = 0;
  for (;;) {
    const std::size_t nl = b.find('\n', start);
    if (nl == std::string::npos) break;
    const std::string_view line(b.data() + start, nl - start);
    start = nl + 1;
    if (line.size() >= kStartedMarker.size() &&
        line.substr(line.size() - kStartedMarker.size()) == kStartedMarker) {
      // A login script's last words without a newline share the marker's line.
      std::string before(line.substr(0, line.size() - kStartedMarker.size()));
      if (!before.empty()) r.out->feed((before + "\n").data(), before.size() + 1);
      r.starting = false;
      const std::string rest = b.substr(start);
      b.clear();
      if (!rest.empty()) r.out->feed(rest.data(), rest.size());
      return;
    }
    r.out->feed(b.data() + (start - line.size() - 1), line.size() + 1);
  }
  b.erase(0, start);
  if (b.size() > kMaxLine) {  // no line end for this long: not the marker's line
    r.out->feed(b.data(), b.size());
    b.clear();
  }
}

void Job::spawn_ready() {
  if (unspawned_.empty()) return;
  if (phase_ != Phase::running) {
    unspawned_.clear();
    return;
  }
  std::map<std::string, int> starting;
  for (const auto& r : ranks_) {
    if (r.alive && r.starting) ++starting[r.host];
  }
  std::vector<int> later;
  for (const int idx : unspawned_) {
    const RankPlan& p = plan_[static_cast<std::size_t>(idx)];
    if (p.kind == HostKind::ssh) {
      if (starting[p.host_key] >= kMaxStartingPerHost) {
        later.push_back(idx);
        continue;
      }
      ++starting[p.host_key];
    }
    spawn(idx);
  }
  unspawned_ = std::move(later);
}

void Job::drain(Rank& r) {
  read_some(r, false, 256);
  read_some(r, true, 256);
}

int Job::next_timeout_ms() const {
  std::optional<kolo::Deadline> next;
  auto consider = [&](const std::optional<kolo::Deadline>& d) {
    if (d) next = next ? next->earlier(*d) : *d;
  };
  if (!timed_out_ && phase_ < Phase::terminating) consider(timeout_deadline_);
  if (phase_ == Phase::grace) consider(grace_deadline_);
  if (phase_ == Phase::terminating) consider(kill_deadline_);
  if (!next) return -1;
  // +1 ms: poll rounds down, and waking just before a deadline would spin once more.
  return next->expired() ? 0 : next->remaining_ms() + 1;
}

void Job::handle_signals() {
  signalfd_siginfo si;
  while (::read(sigfd_, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
    const int sig = static_cast<int>(si.ssi_signo);
    if (sig == SIGCHLD) continue;  // reap() runs after every wake-up
    if (interrupt_signal_ == 0) {
      interrupt_signal_ = sig;
      say(std::string("received ") + signal_name(sig) + "; forwarding it to all ranks");
      signal_ranks(sig, false);
      begin_grace();
    } else {
      // A second Ctrl-C means "now": the user is not waiting for the grace period.
      say(std::string("received ") + signal_name(sig) + " again; killing all ranks");
      signal_ranks(SIGKILL, false);
      phase_ = Phase::killing;
    }
  }
}

void Job::reap() {
  // Ranks reaped in one pass died at about the same time, and waitpid's order says nothing
  // about which came first. A rank killed by a signal is the likely cause (the others usually
  // exit reporting its loss), so within a pass it is the one whose code kolo-run returns.
  struct Failure {
    int code;
    int rank;
    bool by_signal;
  };
  std::vector<Failure> failures;
  reap_pass(failures);
  if (failures.empty() || first_failure_) return;
  if (o_.elastic_min > 0) {  // --elastic: the others may shrink and go on without them
    const auto live =
        std::count_if(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.alive; }) +
        static_cast<std::ptrdiff_t>(unspawned_.size());
    if (live >= o_.elastic_min) {
      for (const Failure& f : failures) {
        say("rank " + std::to_string(f.rank) + " lost; continuing with " + std::to_string(live) +
            " rank(s) (--elastic)");
      }
      return;
    }
  }
  auto pick =
      std::find_if(failures.begin(), failures.end(), [](const Failure& f) { return f.by_signal; });
  if (pick == failures.end()) pick = failures.begin();
  first_failure_ = pick->code;
  failed_rank_ = pick->rank;
  begin_grace();
}

template <class Failures>
void Job::reap_pass(Failures& failures) {
  for (auto& r : ranks_) read_chan(r, failures);
  for (;;) {
    int status = 0;
    const pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) return;
    for (auto& r : ranks_) {
      if (r.watchdog == pid) {
        r.watchdog = -1;
        read_chan(r, failures);  // its last message may still wait in the socket
        close_fd(r.chan_fd);
        if (r.alive) {
          // The watchdog itself was killed: its rank dies with it (PR_SET_PDEATHSIG), and
          // the watchdog's own death is the closest account of the rank's.
          kill_group(r, SIGKILL);
          rank_exited(r, status, failures);
        }
      } else if (r.kind == HostKind::ssh && r.pid == pid && r.alive) {
        rank_exited(r, status, failures);
      }
    }
  }
}

template <class Failures>
void Job::read_chan(Rank& r, Failures& failures) {
  char buf[256];
  while (r.chan_fd >= 0) {
    const ssize_t k = ::recv(r.chan_fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (k > 0) {
      r.chan_buf.append(buf, static_cast<std::size_t>(k));
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) close_fd(r.chan_fd);
    break;
  }
  while (r.chan_buf.size() >= sizeof(kolo_run::WatchdogMsg)) {
    kolo_run::WatchdogMsg m{};
    std::memcpy(&m, r.chan_buf.data(), sizeof(m));
    r.chan_buf.erase(0, sizeof(m));
    if (m.kind == kolo_run::kMsgExited && r.alive) rank_exited(r, m.a, failures);
  }
}

template <class Failures>
void Job::rank_exited(Rank& r, int status, Failures& failures) {
  {
    r.alive = false;
    close_fd(r.ctl_fd);
    // The rank's last words (e.g. its exception) come before kolo-run's verdict on it.
    drain(r);
    int code = 0;
    std::string how;
    bool by_signal = false;
    const bool ssh = r.kind == HostKind::ssh;
    if (WIFEXITED(status)) {
      code = WEXITSTATUS(status);
      how = "exited with code " + std::to_string(code);
      if (ssh && code == 255) {
        how +=
            " (ssh's code for its own failures: unreachable host, refused authentication or "
            "a dropped connection; ssh's message, if any, is above)";
      } else if (ssh && code > 128 && code <= 128 + 64) {
        // The remote shell's status: 128+S is how it reports a death by signal S.
        how = "killed by signal " + describe_signal(code - 128);
        by_signal = true;
      }
    } else if (WIFSIGNALED(status)) {
      code = 128 + WTERMSIG(status);
      how = "killed by signal " + describe_signal(WTERMSIG(status));
      if (WCOREDUMP(status)) how += " (core dumped)";
      if (ssh) how = "lost: its ssh client was " + how;
      by_signal = true;
    }
    if (code == 0 || r.signalled) return;  // success, or the death kolo-run asked for
    say("rank " + std::to_string(r.index) + (ssh ? " on " + r.host : std::string()) + " " + how);
    failures.push_back({code, r.index, by_signal});
  }
}

void Job::begin_grace() {
  if (phase_ != Phase::running) return;
  phase_ = Phase::grace;
  grace_deadline_ = kolo::Deadline::after(o_.grace);
}

std::vector<int> Job::signal_ranks(int sig, bool all_groups) {
  std::vector<int> hit;
  for (auto& r : ranks_) {
    if (!r.alive && !all_groups) continue;
    if (r.kind == HostKind::ssh) {
      signal_remote(r, sig);
    } else {
      kill_group(r, sig);
    }
    if (r.alive) {
      r.signalled = true;
      hit.push_back(r.index);
    }
  }
  return hit;
}

void Job::signal_remote(Rank& r, int sig) {
  const char* name = sig == SIGINT    ? "INT\n"
                     : sig == SIGTERM ? "TERM\n"
                     : sig == SIGHUP  ? "HUP\n"
                                      : nullptr;
  if (name && r.ctl_fd >= 0) {
    // Non-blocking and tiny: a pipe that is full already holds a signal the remote has not
    // read yet, and SIGKILL follows anyway.
    [[maybe_unused]] const ssize_t k = ::write(r.ctl_fd, name, std::strlen(name));
    return;
  }
  if (sig == SIGKILL) {
    close_fd(r.ctl_fd);
    ::kill(-r.pid, SIGKILL);
  }
}

void Job::check_deadlines() {
  if (!timed_out_ && phase_ < Phase::terminating && timeout_deadline_ &&
      timeout_deadline_->expired()) {
    timed_out_ = true;
    say("job exceeded --timeout " + o_.timeout_text + " seconds; killing all ranks");
    terminate();
    return;
  }
  if (phase_ == Phase::grace && grace_deadline_->expired()) {
    terminate();
  } else if (phase_ == Phase::terminating && kill_deadline_->expired()) {
    phase_ = Phase::killing;
    const auto hit = signal_ranks(SIGKILL, true);
    if (!hit.empty()) {
      say("sending SIGKILL to rank(s) " + rank_list(hit) + " (still running " +
          std::to_string(static_cast<int>(kKillAfterTermSeconds)) + " s after SIGTERM)");
    }
  }
}

void Job::terminate() {
  phase_ = Phase::terminating;
  kill_deadline_ = kolo::Deadline::after(kKillAfterTermSeconds);
  const auto hit = signal_ranks(SIGTERM, true);
  if (!hit.empty() && !timed_out_) {
    const std::string after = failed_rank_ >= 0
                                  ? "rank " + std::to_string(failed_rank_) + " failed"
                                  : "the forwarded " + std::string(signal_name(interrupt_signal_));
    say("sending SIGTERM to rank(s) " + rank_list(hit) + " (still running " + o_.grace_text +
        " s after " + after + ")");
  }
}

}  // namespace kolo_run
