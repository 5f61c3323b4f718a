// kolo/transport/mesh/doorbell.hpp — how a mesh rank that sleeps is woken by a local peer.
//
// A rank about to sleep sets the `sleeping` flag in its control block (shared memory), re-checks
// its channels, and then blocks in the poll loop (mesh/poll_loop.hpp), whose pollfd set holds
// this doorbell's read end next to its TCP sockets and its peers' pidfds: one wait for every
// route. A peer that publishes or frees a slot rings only when the flag is set. The seq_cst
// fence on both sides (Dekker's pattern: store flag, fence, load channel / store channel, fence,
// load flag) means that either the sleeper sees the new slot before it sleeps or the producer
// sees the flag and rings: no wake-up is lost. The poll loop also wakes every 200 ms anyway.
//
// The doorbell itself is a named FIFO in /dev/shm (a file descriptor poll() can wait on that
// any local process can open by name; an eventfd would have to be passed between processes).
// Its name is unlinked together with the segment once every rank has opened every doorbell.
//
// This file is the seam for another waiting strategy (a futex in the control block, an eventfd
// handed over with pidfd_getfd): Doorbell is what the sleeper arms, waits on and drains,
// PeerBell what a producer rings; nothing else in the mesh knows how the ring is delivered.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <string>
#include <utility>

#include "kolo/core/error.hpp"
#include "kolo/net/socket.hpp"

namespace kolo::detail {

inline std::string doorbell_path(const std::string& token, int rank) {
  return "/dev/shm/kolo-" + token + "-" + std::to_string(rank) + ".bell";
}

// This rank's own doorbell: created once, armed before each sleep, drained after each wake-up.
class Doorbell {
 public:
  Doorbell() = default;
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;
  Doorbell(Doorbell&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), sleeping_(std::exchange(o.sleeping_, nullptr)) {}
  Doorbell& operator=(Doorbell&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(sleeping_, o.sleeping_);
    return *this;
  }
  ~Doorbell() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Creates the FIFO at `path`; `sleeping` is the flag in this rank's control block.
  void create(const std::string& path, std::atomic<std::uint32_t>* sleeping) {
    sleeping_ = sleeping;
    if (::mkfifo(path.c_str(), 0600) != 0) {
      throw Error("mkfifo(" + path + ") failed: " + net::errno_text(errno));
    }
    // O_RDWR: opening never blocks and the FIFO never reports EOF while we hold it.
    fd_ = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) throw Error("open(" + path + ") failed: " + net::errno_text(errno));
  }

  bool valid() const { return fd_ >= 0; }
  // What the poll loop waits on (POLLIN: rung).
  int fd() const { return fd_; }

  // Before the last check of the channels that precedes a sleep.
  void arm() { sleeping_->store(1, std::memory_order_seq_cst); }
  // After waking (or after that last check found work).
  void disarm() { sleeping_->store(0, std::memory_order_relaxed); }
  // Wakes this rank's own sleeper from another thread (MeshTransport::interrupt).
  void ring_self() const {
    if (fd_ < 0) return;
    const char b = 1;
    [[maybe_unused]] const ssize_t k = ::write(fd_, &b, 1);  // EAGAIN: already rung
  }
  // Swallows the rings that woke us (they carry no information but "look again").
  void drain() {
    char buf[256];
    while (::read(fd_, buf, sizeof(buf)) > 0) {
    }
  }

 private:
  int fd_ = -1;
  std::atomic<std::uint32_t>* sleeping_ = nullptr;
};

// A local peer's doorbell, as its producers ring it.
class PeerBell {
 public:
  PeerBell() = default;
  PeerBell(const PeerBell&) = delete;
  PeerBell& operator=(const PeerBell&) = delete;
  PeerBell(PeerBell&& o) noexcept
      : fd_(std::exchange(o.fd_, -1)), sleeping_(std::exchange(o.sleeping_, nullptr)) {}
  PeerBell& operator=(PeerBell&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(sleeping_, o.sleeping_);
    return *this;
  }
  ~PeerBell() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Opens rank `rank`'s FIFO at `path`; `sleeping` is the flag in that rank's control block.
  void open(const std::string& path, int rank, std::atomic<std::uint32_t>* sleeping) {
    sleeping_ = sleeping;
    // O_RDWR, not O_WRONLY: holding a read end ourselves means the FIFO never loses its last
    // reader, so ringing a peer that has exited (e.g. after it aborted) cannot raise SIGPIPE
    // and kill this rank before it reports the error; unread bytes just fill the pipe (EAGAIN).
    fd_ = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd_ < 0) {
      throw Error("cannot open the doorbell of rank " + std::to_string(rank) + ": " +
                  net::errno_text(errno));
    }
  }

  // After publishing or freeing slots: wakes the peer if it sleeps (always, with `force`).
  void ring(bool force = false) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (fd_ >= 0 && (force || sleeping_->load(std::memory_order_relaxed) != 0)) {
      const char b = 1;
      [[maybe_unused]] const ssize_t k = ::write(fd_, &b, 1);  // EAGAIN: already rung
    }
  }

 private:
  int fd_ = -1;
  std::atomic<std::uint32_t>* sleeping_ = nullptr;
};

}  // namespace kolo::detail
