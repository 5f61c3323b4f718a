// rank_watchdog.hpp — the small process kolo-run puts between itself and each rank on this
// machine: it starts the rank, reports its start and its exit status to kolo-run, and releases
// the rank's whole process tree when the rank ends or when kolo-run dies (even by SIGKILL).
//
// Why a process of its own: PR_SET_PDEATHSIG reaches only the direct child, so a SIGKILLed
// kolo-run used to leave whatever its ranks had started running. The watchdog
//   * is a child subreaper (PR_SET_CHILD_SUBREAPER): everything the rank starts, even what
//     double-forks or calls setsid(), is re-parented to it instead of init when its parent dies;
//   * starts the rank in a process group of its own (kolo-run signals that group, as before)
//     with PR_SET_PDEATHSIG = SIGKILL towards the watchdog;
//   * holds one end of a socketpair whose other end only kolo-run has: end-of-file on it means
//     kolo-run is gone (or is done with the rank);
//   * when the rank has exited, or at that end-of-file, sends SIGTERM to the rank's group and to
//     every process re-parented to it, SIGKILL `kill_after_term` seconds later, and exits when
//     none is left.
// It stays in kolo-run's process group with SIGINT/SIGTERM/SIGHUP blocked (kolo-run's mask), so
// a Ctrl-C at the terminal or a signal to kolo-run's group reaches kolo-run, which forwards it.
//
// It runs in a child forked from the multi-threaded kolo-run without exec, so it uses only
// async-signal-safe calls (no allocation, no stdio): plain system calls on fixed buffers.
#pragma once

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

namespace kolo_run {

// What the watchdog tells kolo-run, as fixed-size records on their socket.
struct WatchdogMsg {
  std::int32_t kind;
  std::int32_t a;
  std::int32_t b;
};
// a = the rank's pid (-1: the watchdog could not fork, b = errno); b = exec's errno (0: it ran).
constexpr std::int32_t kMsgStarted = 1;
// a = the rank's wait status, as waitpid gave it.
constexpr std::int32_t kMsgExited = 2;

struct WatchdogSpec {
  int in_fd;    // becomes the rank's stdin
  int out_fd;   // ... stdout (the write end of kolo-run's pipe)
  int err_fd;   // ... stderr
  int chan_fd;  // the watchdog's end of the socketpair with kolo-run
  const char* exe;
  char* const* argv;
  char* const* envp;
  const sigset_t* rank_mask;             // the signal mask the rank starts with
  const struct sigaction* rank_sigpipe;  // and its SIGPIPE disposition
  int kill_after_term_ms;                // SIGTERM -> SIGKILL for what is left of the rank
};

namespace detail {

inline void send_msg(int fd, std::int32_t kind, std::int32_t a, std::int32_t b) {
  const WatchdogMsg m{kind, a, b};
  const char* p = reinterpret_cast<const char*>(&m);
  std::size_t left = sizeof(m);
  while (left > 0) {
    const ssize_t k = ::send(fd, p, left, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;  // kolo-run is gone: nobody to tell
    p += k;
    left -= static_cast<std::size_t>(k);
  }
}

inline std::int64_t now_ms() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// "/proc/self/task/<tid>/children" of this single-threaded process: its direct children.
inline void children_path(char* path, pid_t self) {
  const char head[] = "/proc/self/task/";
  const char tail[] = "/children";
  int n = 0;
  for (const char* c = head; *c; ++c) path[n++] = *c;
  char digits[16];
  int d = 0;
  for (unsigned v = static_cast<unsigned>(self); v > 0 || d == 0; v /= 10) {
    digits[d++] = static_cast<char>('0' + v % 10);
  }
  while (d > 0) path[n++] = digits[--d];
  for (const char* c = tail; *c; ++c) path[n++] = *c;
  path[n] = '\0';
}

// Sends `sig` to every direct child (and the group each may lead); returns how many there are.
inline int signal_children(const char* path, int sig) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  int count = 0;
  long pid = 0;
  bool in_number = false;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    for (ssize_t i = 0; i < k; ++i) {
      if (buf[i] >= '0' && buf[i] <= '9') {
        pid = pid * 10 + (buf[i] - '0');
        in_number = true;
      } else if (in_number) {
        if (sig != 0) {
          ::kill(static_cast<pid_t>(pid), sig);
          ::kill(-static_cast<pid_t>(pid), sig);  // ESRCH unless it leads a group of its own
        }
        ++count;
        pid = 0;
        in_number = false;
      }
    }
  }
  if (in_number) {
    if (sig != 0) {
      ::kill(static_cast<pid_t>(pid), sig);
      ::kill(-static_cast<pid_t>(pid), sig);
    }
    ++count;
  }
  ::close(fd);
  return count;
}

// Closes fds first..last (last < 0: all above first).
inline void close_fds(int first, int last) {
  const unsigned hi = last < 0 ? ~0U : static_cast<unsigned>(last);
  if (::close_range(static_cast<unsigned>(first), hi, 0) == 0) return;
  const int end = last < 0 ? 65535 : last;  // no close_range (kernel < 5.9)
  for (int fd = first; fd <= end; ++fd) ::close(fd);
}

}  // namespace detail

// The watchdog's whole life; never returns.
[[noreturn]] inline void run_watchdog(const WatchdogSpec& s) {
  // The rank's three fds on 0-2, the socket on 3, nothing else: not the store's sockets, not
  // other ranks' pipes or sockets (another rank's socket held here would hide kolo-run's death
  // from that rank's watchdog). Everything else is closed first, so the moves below find free
  // fds even when kolo-run's table was full.
  int keep[4] = {s.in_fd, s.out_fd, s.err_fd, s.chan_fd};
  for (int i = 1; i < 4; ++i) {  // sort the four (insertion sort: no library call)
    for (int j = i; j > 0 && keep[j - 1] > keep[j]; --j) {
      const int t = keep[j];
      keep[j] = keep[j - 1];
      keep[j - 1] = t;
    }
  }
  int next = 0;
  for (const int fd : keep) {
    if (fd > next) detail::close_fds(next, fd - 1);
    if (fd + 1 > next) next = fd + 1;
  }
  detail::close_fds(next, -1);
  const int in = ::fcntl(s.in_fd, F_DUPFD, 10);
  const int out = ::fcntl(s.out_fd, F_DUPFD, 10);
  const int err = ::fcntl(s.err_fd, F_DUPFD, 10);
  const int chan = ::fcntl(s.chan_fd, F_DUPFD, 10);
  if (in < 0 || out < 0 || err < 0 || chan < 0) ::_exit(1);
  if (::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(err, 2) < 0 || ::dup2(chan, 3) < 0) {
    ::_exit(1);
  }
  detail::close_fds(4, -1);
  ::fcntl(3, F_SETFD, FD_CLOEXEC);  // the rank must not hold it
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);

  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  ::sigprocmask(SIG_BLOCK, &chld, nullptr);  // already blocked by kolo-run; made sure
  const int sfd = ::signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  int exec_pipe[2];
  if (sfd < 0 || ::pipe2(exec_pipe, O_CLOEXEC) != 0) {
    detail::send_msg(3, kMsgStarted, -1, errno);
    ::_exit(1);
  }
  const pid_t self = ::getpid();
  const pid_t rank = ::fork();
  if (rank < 0) {
    detail::send_msg(3, kMsgStarted, -1, errno);
    ::_exit(1);
  }
  if (rank == 0) {
    // Own process group: kolo-run signals the rank together with whatever it starts.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the watchdog is never killed by kolo-run's signals
    if (::getppid() != self) ::_exit(1);
    ::sigprocmask(SIG_SETMASK, s.rank_mask, nullptr);
    ::sigaction(SIGPIPE, s.rank_sigpipe, nullptr);
    ::execve(s.exe, s.argv, s.envp);
    const int e = errno;
    [[maybe_unused]] const ssize_t k = ::write(exec_pipe[1], &e, sizeof(e));
    ::_exit(e == ENOENT ? 127 : 126);
  }
  ::setpgid(rank, rank);  // also from here, so kill(-rank) works whichever runs first
  ::close(exec_pipe[1]);
  // The rank's pipes belong to the rank: kolo-run sees their end-of-file when the rank's tree
  // closes them, not when the watchdog does.
  ::close(0);
  ::close(1);
  ::close(2);
  int exec_errno = 0;
  ssize_t k;
  do {
    k = ::read(exec_pipe[0], &exec_errno, sizeof(exec_errno));
  } while (k < 0 && errno == EINTR);
  ::close(exec_pipe[0]);
  if (k != static_cast<ssize_t>(sizeof(exec_errno))) exec_errno = 0;
  detail::send_msg(3, kMsgStarted, rank, exec_errno);

  char children[64];
  detail::children_path(children, self);
  bool rank_alive = true;
  int chan_fd = 3;
  enum { running, terming, killing } state = running;
  std::int64_t kill_at = 0;
  auto signal_all = [&](int sig) {
    ::kill(-rank, sig);  // the rank's group, the rank itself included while it lives
    detail::signal_children(children, sig);
  };
  auto end_rank = [&] {
    if (state != running) return;
    signal_all(SIGTERM);
    state = terming;
    kill_at = detail::now_ms() + s.kill_after_term_ms;
  };
  for (;;) {
    int status = 0;
    for (pid_t p; (p = ::waitpid(-1, &status, WNOHANG)) > 0;) {
      if (p == rank && rank_alive) {
        rank_alive = false;
        detail::send_msg(3, kMsgExited, status, 0);
        end_rank();  // what the rank left behind goes with it
      }
    }
    if (!rank_alive) {
      const bool group_left = ::kill(-rank, 0) == 0 || errno != ESRCH;
      if (!group_left && detail::signal_children(children, 0) == 0) ::_exit(0);
    }
    if (state == terming && detail::now_ms() >= kill_at) state = killing;
    if (state == killing) {
      signal_all(SIGKILL);  // again each round: new orphans arrive
      // Only a process it may not signal (EPERM) survives SIGKILL: do not wait for it for ever.
      if (detail::now_ms() >= kill_at + 2000) ::_exit(0);
    }
    int timeout = -1;
    if (state == terming) timeout = static_cast<int>(kill_at - detail::now_ms()) + 1;
    if (state == killing) timeout = 20;
    pollfd fds[2] = {{chan_fd, POLLIN, 0}, {sfd, POLLIN, 0}};
    const int rc = ::poll(fds, 2, timeout < 0 ? -1 : timeout);
    if (rc <= 0) continue;
    if (fds[0].revents != 0) {
      char b[64];
      const ssize_t n = ::recv(chan_fd, b, sizeof(b), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        chan_fd = -1;  // kolo-run is gone or done with the rank (poll ignores fd -1)
        end_rank();
      }
    }
    if (fds[1].revents != 0) {
      signalfd_siginfo si;
      while (::read(sfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
      }
    }
  }
}

}  // namespace kolo_run
