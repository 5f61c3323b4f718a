// kolo/transport/detail/mesh_impl.hpp — MeshTransport's cold definitions (transport/mesh.hpp):
// the connection set-up, the timeout's diagnosis, and the drain of TCP sockets after an abort.
//
// Kept out of the public path with the connection code (mesh/connect.hpp, the handshake and its
// OpenSSL headers): header-only, mesh.hpp includes this file; with the compiled core only the
// library does (core/compiled_core.hpp, KOLO_IMPL_INLINE).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/deadline.hpp"
#include "kolo/transport/mesh.hpp"
#include "kolo/transport/mesh/connect.hpp"

namespace kolo::detail {

// After an abort a peer may still be sending us the rest of a message. Closing a socket with
// unread bytes makes the kernel send a reset and throw away what we had queued for the peer,
// which can be the ABORT frame telling it why (it would then report "rank R exited" instead of
// the real error). So read and discard until each peer closes too — it does as soon as it has
// read our ABORT — for at most one second in all.
inline void drain_before_close(const std::vector<int>& sockets) noexcept {
  const Deadline dl = Deadline::after(1.0);
  std::vector<pollfd> fds;
  for (int fd : sockets) fds.push_back({fd, POLLIN, 0});
  std::vector<char> sink(64 * 1024);
  while (!fds.empty() && !dl.expired()) {
    if (::poll(fds.data(), fds.size(), dl.remaining_ms()) < 0 && errno != EINTR) return;
    for (auto& f : fds) {
      if (f.revents == 0) continue;
      for (;;) {
        const ssize_t k = ::recv(f.fd, sink.data(), sink.size(), MSG_DONTWAIT);
        if (k > 0) continue;
        if (k < 0 && errno == EINTR) continue;
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) f.fd = -1;  // done
        break;
      }
      f.revents = 0;
    }
    std::erase_if(fds, [](const pollfd& f) { return f.fd < 0; });
  }
}

// The drain above takes up to a second. A transport that aborted must not make its owner wait
// for it (an exception leaving a scope destroys the communicator on its way to the handler, and
// the error would surface a second late), so its destructor hands duplicates of the sockets to
// a background thread that drains and closes them. The threads are joined at exit (each ends
// within its second), so a program that ends right after the error still lets its peers read
// the ABORT it sent.
class BackgroundDrains {
 public:
  static void start(std::vector<int> owned) noexcept {
    if (owned.empty()) return;
    try {
      BackgroundDrains& d = instance();
      std::lock_guard<std::mutex> lock(d.mu_);
      d.threads_.emplace_back([fds = owned] {
        drain_before_close(fds);
        for (int fd : fds) ::close(fd);
      });
    } catch (...) {
      // No thread: drain here, as before (bounded by a second).
      drain_before_close(owned);
      for (int fd : owned) ::close(fd);
    }
  }

 private:
  static BackgroundDrains& instance() {
    // Never destroyed: joined by the atexit hook, which runs before static destructors of
    // objects constructed earlier.
    static BackgroundDrains* d = [] {
      auto* p = new BackgroundDrains();
      std::atexit([] { join_all(); });
      return p;
    }();
    return *d;
  }
  static void join_all() noexcept {
    std::vector<std::thread> ts;
    {
      BackgroundDrains& d = instance();
      std::lock_guard<std::mutex> lock(d.mu_);
      ts.swap(d.threads_);
    }
    for (auto& t : ts) {
      if (t.joinable()) t.join();
    }
  }

  std::mutex mu_;
  std::vector<std::thread> threads_;
};

}  // namespace kolo::detail

namespace kolo {

KOLO_IMPL_INLINE void MeshTransport::setup(Bootstrap& boot) {
  // The wait policy (mesh/poll_loop.hpp). Spinning pays only while every rank of this host has
  // its own core; otherwise a spinning rank holds the core its peer needs to produce the data,
  // so it hands the core on at every check.
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const bool crowded = static_cast<unsigned>(boot.topology().local_size) > cores;
  detail::WaitPolicy wait;
  wait.fixed_us = opts_.spin_us;
  wait.min_us = opts_.spin_min_us >= 0 ? opts_.spin_min_us : (crowded ? 20.0 : 50.0);
  wait.max_us = opts_.spin_max_us;
  wait.yield_every = opts_.yield_every > 0 ? opts_.yield_every : (crowded ? 1 : 1024);
  wait.spread = opts_.spread && !crowded;
  loop_.set_policy(wait);
  detail::MeshLinks links =
      detail::connect_mesh(boot, mode_, detail::ShmGeometry{opts_.shm_slots, opts_.shm_slot_bytes},
                           opts_.tcp_frame_bytes);
  for (std::size_t p = 0; p < peers_.size(); ++p) {
    detail::PeerLink& link = links.peers[p];
    peers_[p].route = link.route;
    peers_[p].pid = link.pid;
    peers_[p].shm = std::move(link.shm);
    peers_[p].tcp = std::move(link.tcp);
  }
  own_ = std::move(links.own);
  local_ranks_ = links.local_ranks;
  if (size_ > 1) {
    store_ = boot.shared_store();
    progress_key_ = boot.prefix() + "progress/";
  }
}

KOLO_IMPL_INLINE void MeshTransport::drain_tcp_before_close() noexcept {
  std::vector<int> fds;
  for (const Peer& p : peers_) {
    if (p.route == Route::tcp && p.tcp.valid() && !p.tcp.closed()) {
      const int d = ::fcntl(p.tcp.fd(), F_DUPFD_CLOEXEC, 0);
      if (d >= 0) fds.push_back(d);
    }
  }
  detail::BackgroundDrains::start(std::move(fds));
}

KOLO_IMPL_INLINE void MeshTransport::still_waiting() {
  if (!store_) return;
  const Signature* s = waiting_sig();
  if (s == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  if (!watching_ || *s != watch_sig_) {
    watching_ = true;
    watch_sig_ = *s;
    watch_since_ = now;
    watch_posted_ = false;
    return;
  }
  const double report_after = std::min(1.0, timeout_ / 4);
  if (!watch_posted_) {
    if (std::chrono::duration<double>(now - watch_since_).count() < report_after) return;
    watch_posted_ = true;
    last_check_ = now;
    try {
      store_->set(progress_key_ + std::to_string(rank_), progress_entry(*s));
    } catch (...) {
      // best effort: the diagnosis is a hint, never a new failure
    }
    return;
  }
  // While the wait goes on, look at the peers' entries now and then (4 times a second): one
  // in this same call with other arguments is a mismatch whose messages never met (the ranks
  // chose different algorithms for their different sizes), found now instead of at the
  // deadline.
  if (now - last_check_ < std::chrono::milliseconds(250)) return;
  last_check_ = now;
  check_peer_calls(*s);
}

KOLO_IMPL_INLINE void MeshTransport::check_peer_calls(const Signature& s) {
  if (!store_) return;
  const std::string mine = progress_entry(s);
  const std::string call = mine.substr(0, mine.find(':', mine.find(':') + 1) + 1);
  int other = -1;
  std::string theirs;
  try {
    for (int p = 0; p < size_ && other < 0; ++p) {
      if (p == rank_) continue;
      const auto v = store_->try_get(progress_key_ + std::to_string(p));
      if (v && *v != mine && v->rfind(call, 0) == 0) {
        other = p;
        theirs = entry_words(*v);
      }
    }
  } catch (...) {
    return;
  }
  if (other < 0) return;
  try {
    throw MismatchError("collective mismatch: rank " + std::to_string(other) + " called " + theirs +
                        " but rank " + std::to_string(rank_) + " called " + s.describe() +
                        " (found while both waited: their messages never met, as happens "
                        "when different sizes make the ranks choose different algorithms)");
  } catch (const Error& e) {
    fail(e);
  }
}

KOLO_IMPL_INLINE std::string MeshTransport::missing_ranks() const {
  if (!store_) return "";
  const Signature* s = waiting_sig();
  if (s == nullptr) return "";
  const std::string mine = progress_entry(*s);
  std::vector<int> absent;
  std::string last;
  try {
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      const auto v = store_->try_get(progress_key_ + std::to_string(p));
      if (v && *v == mine) continue;
      absent.push_back(p);
      if (absent.size() <= 4) {
        last += std::string(last.empty() ? "" : "; ") + "rank " + std::to_string(p) +
                (v ? " was last seen waiting in " + entry_words(*v)
                   : " was not seen waiting in any operation");
      }
    }
  } catch (...) {
    return "";
  }
  if (absent.empty()) return "";
  std::string who;
  for (std::size_t i = 0; i < absent.size() && i < 8; ++i) {
    who += std::string(i == 0 ? "" : ", ") + std::to_string(absent[i]);
  }
  if (absent.size() > 8) who += " and " + std::to_string(absent.size() - 8) + " more";
  return std::string(absent.size() == 1 ? "; rank " : "; ranks ") + who + " never reached " +
         s->describe() + " (" + last +
         "): a rank skipped this call, or is stuck in other work (compute, I/O, a deadlock in "
         "the program)";
}

KOLO_IMPL_INLINE std::string MeshTransport::timeout_message() const {
  std::string waiting;
  std::string what;
  for (int p = 0; p < size_; ++p) {
    const Peer& peer = peers_[static_cast<std::size_t>(p)];
    if (peer.sendq.empty() && peer.recvq.empty()) continue;
    if (what.empty()) {
      what = pool_[peer.recvq.empty() ? peer.sendq.front() : peer.recvq.front()].sig.describe();
    }
    waiting += (waiting.empty() ? "" : ", ") + peer_desc(p);
  }
  char to[32];
  std::snprintf(to, sizeof(to), "%g", timeout_);
  const std::string missing = missing_ranks();
  return "rank " + std::to_string(rank_) + " timed out in " + (what.empty() ? "a wait" : what) +
         " after " + to + " s waiting for " + (waiting.empty() ? "nothing" : waiting) +
         (missing.empty() ? " (raise KOLO_TIMEOUT_SECONDS if the job is just slow)" : missing);
}

}  // namespace kolo
