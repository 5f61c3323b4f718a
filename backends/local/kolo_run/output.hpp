// kolo-run's output: its own stdout and stderr written without ever blocking the poll loop
// (OutStream: buffered, bounded by back-pressure on the ranks' pipes), and LineRelay, which
// cuts one rank's stream into whole lines with the "[rank] " prefix.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo_run/common.hpp"

namespace kolo_run {

// All output, the ranks' and kolo-run's own messages, goes through an OutStream from the one
// thread, and every call carries whole lines: that is what keeps lines from interleaving.
//
// Writing never blocks the poll loop (a stalled reader must not hold --timeout, the grace
// period or a signal): once prepare() has run, a pipe or terminal is written through a second
// open file description of it with O_NONBLOCK (reopened via /proc/self/fd, so the flags of the
// description kolo-run shares with its shell stay untouched), a socket with MSG_DONTWAIT, and
// what does not fit waits in a buffer. The buffer is bounded by back-pressure, not by dropping:
// while a stream holds kOutBuffer bytes or more, kolo-run stops reading the ranks' pipes that
// feed it, so the ranks block on their own writes, as they would writing to that reader
// directly. Only at exit, what a reader still has not taken is dropped, with a counted note.
// Regular files (and anything that cannot be reopened) are written as before, blocking.
constexpr std::size_t kOutBuffer = 256 * 1024;

class OutStream {
 public:
  explicit OutStream(int fd) : fd_(fd), wfd_(fd) {}
  OutStream(const OutStream&) = delete;
  OutStream& operator=(const OutStream&) = delete;

  void prepare() {
    struct stat st {};
    const int fl = ::fcntl(fd_, F_GETFL);
    if (fl < 0 || ::fstat(fd_, &st) != 0) return;
    if (S_ISSOCK(st.st_mode)) {
      mode_ = Mode::socket;
    } else if (fl & O_NONBLOCK) {
      mode_ = Mode::nonblocking;  // inherited that way: use it as it is
    } else if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode)) {
      const std::string path = "/proc/self/fd/" + std::to_string(fd_);
      const int n =
          ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (fl & O_APPEND));
      if (n >= 0) {
        wfd_ = n;
        mode_ = Mode::nonblocking;
      }
    }
  }

  void write(std::string_view data) {
    if (!ok_ || data.empty()) return;
    if (mode_ == Mode::blocking) {
      write_blocking(data);
      return;
    }
    if (pending() == 0) {
      buf_.clear();
      off_ = 0;
      data.remove_prefix(put(data));
      if (!ok_) return;
    }
    buf_.append(data);
  }

  // Writes what the reader takes now; never waits.
  void flush() {
    if (pending() == 0) return;
    off_ += put(std::string_view(buf_).substr(off_));
    if (off_ == buf_.size()) {
      buf_.clear();
      off_ = 0;
    } else if (off_ > kOutBuffer) {
      buf_.erase(0, off_);
      off_ = 0;
    }
  }

  std::size_t pending() const { return ok_ ? buf_.size() - off_ : 0; }
  bool full() const { return pending() >= kOutBuffer; }
  int poll_fd() const { return wfd_; }

  // At exit: forgets what the reader did not take; returns how many bytes that was.
  std::size_t drop() {
    const std::size_t n = pending();
    buf_.clear();
    off_ = 0;
    return n;
  }

 private:
  enum class Mode { blocking, nonblocking, socket };

  // One non-blocking attempt (as many writes as the reader takes); returns the bytes written.
  std::size_t put(std::string_view data) {
    std::size_t done = 0;
    while (done < data.size()) {
      const ssize_t k =
          mode_ == Mode::socket
              ? ::send(wfd_, data.data() + done, data.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL)
              : ::write(wfd_, data.data() + done, data.size() - done);
      if (k > 0) {
        done += static_cast<std::size_t>(k);
      } else if (k < 0 && errno == EINTR) {
        continue;
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        break;
      } else {
        // The reader went away (EPIPE) or the fd is bad: stop writing, but keep supervising
        // the ranks, which matters more than their output.
        ok_ = false;
        buf_.clear();
        off_ = 0;
        break;
      }
    }
    return done;
  }

  void write_blocking(std::string_view data) {
    while (ok_ && !data.empty()) {
      const ssize_t k = ::write(fd_, data.data(), data.size());
      if (k > 0) {
        data.remove_prefix(static_cast<std::size_t>(k));
      } else if (k < 0 && errno == EINTR) {
        continue;
      } else if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        pollfd p{fd_, POLLOUT, 0};  // before prepare(): a non-blocking fd we inherited
        ::poll(&p, 1, 1000);
      } else {
        ok_ = false;
      }
    }
  }

  int fd_;
  int wfd_;
  Mode mode_ = Mode::blocking;
  bool ok_ = true;
  std::string buf_;
  std::size_t off_ = 0;
};

// kolo-run's own stdout and stderr (one stream when they are the same pipe or terminal).
inline OutStream g_stdout_stream(STDOUT_FILENO);
inline OutStream g_stderr_stream(STDERR_FILENO);
inline OutStream* g_stdout = &g_stdout_stream;
inline OutStream* g_stderr = &g_stderr_stream;

// Switches both streams to non-blocking writes; stdout and stderr that are one pipe or
// terminal (2>&1) become one stream, so their lines stay whole and in order.
inline void prepare_output() {
  struct stat a {
  }, b{};
  if (::fstat(STDOUT_FILENO, &a) == 0 && ::fstat(STDERR_FILENO, &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino && !S_ISREG(a.st_mode)) {
    g_stderr = g_stdout;
  }
  g_stdout->prepare();
  if (g_stderr != g_stdout) g_stderr->prepare();
}

// Waits (poll, never spinning) until both streams are written out, or until no byte could be
// written for `stall_s` seconds, or a signal arrives on `sigfd` (when >= 0). Returns whether
// everything was written.
inline bool flush_output(double stall_s, int sigfd) {
  auto stall = kolo::Deadline::after(stall_s);
  for (;;) {
    g_stdout->flush();
    g_stderr->flush();
    std::vector<pollfd> fds;
    for (OutStream* s : {g_stdout, g_stderr}) {
      if (s->pending() > 0 && (fds.empty() || fds.back().fd != s->poll_fd())) {
        fds.push_back({s->poll_fd(), POLLOUT, 0});
      }
    }
    if (fds.empty()) return true;
    if (stall.expired()) return false;
    if (sigfd >= 0) fds.push_back({sigfd, POLLIN, 0});
    const std::size_t before = g_stdout->pending() + g_stderr->pending();
    const int rc = ::poll(fds.data(), fds.size(), stall.remaining_ms() + 1);
    if (sigfd >= 0 && rc > 0 && fds.back().revents != 0) {
      // A signal ends the wait (the user is not waiting for the reader either); SIGCHLD, a
      // watchdog's exit, does not.
      signalfd_siginfo si;
      while (::read(sigfd, &si, sizeof(si)) == static_cast<ssize_t>(sizeof(si))) {
        if (si.ssi_signo != SIGCHLD) return false;
      }
    }
    g_stdout->flush();
    g_stderr->flush();
    if (g_stdout->pending() + g_stderr->pending() < before) stall = kolo::Deadline::after(stall_s);
  }
}

// After flush_output gave up: drops what is left, with a note on stderr saying how much.
inline void drop_output() {
  const std::size_t out = g_stdout->drop();
  const std::size_t err = g_stderr == g_stdout ? 0 : g_stderr->drop();
  if (out + err == 0) return;
  g_stderr->write("[kolo-run: " + std::to_string(out + err) +
                  " bytes of output dropped, reader too slow]\n");
  g_stderr->flush();
}

inline void say(const std::string& msg) {
  g_stderr->write("kolo-run: " + msg + "\n");
}

// Splits one rank stream into lines and re-emits them with the rank prefix.
class LineRelay {
 public:
  LineRelay(OutStream* out, std::string prefix) : out_(out), prefix_(std::move(prefix)) {}

  void feed(const char* data, std::size_t n) {
    pending_.append(data, n);
    std::string batch;
    std::size_t start = 0;
    for (;;) {
      const std::size_t nl = pending_.find('\n', start);
      if (nl == std::string::npos) break;
      batch += prefix_;
      batch.append(pending_, start, nl + 1 - start);
      start = nl + 1;
    }
    pending_.erase(0, start);
    if (pending_.size() >= kMaxLine) emit_pending(batch);
    if (!batch.empty()) out_->write(batch);
  }

  // The stream this relay feeds holds as much as kolo-run buffers: read no more for now.
  bool full() const { return out_->full(); }

  // At EOF: a last line without '\n' is still output. With a prefix it gets a '\n' so the next
  // rank's line starts on a line of its own; without one the bytes pass through unchanged.
  void finish() {
    std::string batch;
    emit_pending(batch);
    if (!batch.empty()) out_->write(batch);
  }

 private:
  void emit_pending(std::string& batch) {
    if (pending_.empty()) return;
    batch += prefix_;
    batch += pending_;
    if (!prefix_.empty()) batch += '\n';
    pending_.clear();
  }

  OutStream* out_;
  std::string prefix_;
  std::string pending_;
};

}  // namespace kolo_run
