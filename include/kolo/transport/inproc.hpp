// kolo/transport/inproc.hpp — InprocTransport: a Transport whose ranks are threads of one
// process (Gloo's test style).
//
// For testing the algorithms alone, every rank count in one process, under ASan and TSan
// (tests/inproc), and for micro-benchmarks of them (benchmarks/micro_ring.cpp): no sockets, no
// shared-memory slots, no process boundary, so what remains is the algorithms' own work — plus
// the one unavoidable pass over the data. It is a complete transport (transport.hpp): threads
// build `Communicator<InprocTransport>(std::make_unique<InprocTransport>(fabric, rank), opts)`
// and run every collective through the Selector as processes do.
//
// Messages rendezvous: a send only queues a pointer, and the receiving thread copies or
// reduces straight out of the sender's buffer (the zero-copy ideal that a CMA/XPMEM transport
// would reach between processes), then completes the send. Completion per peer and direction
// is in posting order, as the Transport concept requires, so a request is just a sequence
// number.
//
// Waiting spins briefly when every rank has its own core and otherwise sleeps on a condition
// variable, for the same reason MeshTransport does: a spinning thread would steal the core its
// peer needs to produce the data.
//
// Errors: a mismatched message (signature or size), a timeout, or abort() on any rank aborts the
// fabric; every rank's next call (or its current wait) throws that error, as a mesh rank would.
// Because a receiver reads straight from the sender's buffer, an algorithm that changes a send
// buffer before the send completes gets wrong results here (where a copying transport would
// hide it): the contract says the buffer stays valid and unchanged until then. A rank whose
// call throws because the fabric was aborted first waits until no peer is still reading one of
// its send buffers (the caller frees them as the error unwinds): once aborted, no peer starts
// reading, and a read under way finishes first.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

class InprocTransport;

// What the threads of one in-process job share: one inbox per rank, and the job's error.
class InprocFabric {
 public:
  explicit InprocFabric(int size, double timeout_seconds = 60.0)
      : size_(size), timeout_(timeout_seconds) {
    if (size < 1) throw ConfigError("InprocFabric: size " + std::to_string(size) + " < 1");
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<RankBox>(size));
    spin_ = static_cast<unsigned>(size) <= std::max(1u, std::thread::hardware_concurrency());
  }

  int size() const { return size_; }
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

 private:
  friend class InprocTransport;

  struct Send {
    const std::byte* src = nullptr;
    std::size_t bytes = 0;
    Signature sig;
  };

  struct RankBox {
    explicit RankBox(int n)
        : inbound(static_cast<std::size_t>(n)),
          sends_done(std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n))) {}
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::deque<Send>> inbound;  // by sending rank; guarded by mu
    // sends_done[p]: how many of this rank's sends to p have been consumed. Written under mu
    // (so a sleeping owner cannot miss it), read without it by done().
    std::unique_ptr<std::atomic<std::uint64_t>[]> sends_done;
    std::atomic<std::uint64_t> send_completions{0};
    // Peers copying or reducing out of this rank's send buffers right now. Raised by the reader
    // under its own mu (after seeing the fabric not aborted), lowered under this rank's mu.
    std::atomic<int> reading{0};
  };

  RankBox& box(int r) { return *ranks_[static_cast<std::size_t>(r)]; }

  void abort(const Error& e) {
    {
      std::lock_guard<std::mutex> lk(err_mu_);
      if (aborted_.load()) return;
      kind_ = e.kind();
      what_ = e.what();
      aborted_.store(true);
    }
    for (auto& b : ranks_) {
      std::lock_guard<std::mutex> lk(b->mu);  // orders the flag before any sleeper's recheck
      b->cv.notify_all();
    }
  }

  void rethrow_if_aborted() {
    if (!aborted_.load(std::memory_order_acquire)) return;
    rethrow();
  }
  [[noreturn]] void rethrow() {
    ErrorKind kind;
    std::string what;
    {
      std::lock_guard<std::mutex> lk(err_mu_);
      kind = kind_;
      what = what_;
    }
    throw_error(kind, what);
  }

  int size_;
  double timeout_;
  bool spin_ = false;
  std::vector<std::unique_ptr<RankBox>> ranks_;
  std::atomic<bool> aborted_{false};
  std::mutex err_mu_;
  ErrorKind kind_ = ErrorKind::generic;
  std::string what_;
};

class InprocTransport {
 public:
  struct Request {
    int peer = 0;
    bool send = false;
    std::uint64_t seq = 0;
  };

  // Rank `rank` of the fabric's job; one transport per rank, each used by one thread at a time.
  InprocTransport(InprocFabric& fabric, int rank)
      : f_(check_rank(fabric, rank)),
        me_(fabric.box(rank)),
        rank_(rank),
        sends_posted_(static_cast<std::size_t>(fabric.size()), 0),
        recvs_posted_(static_cast<std::size_t>(fabric.size()), 0),
        recvs_done_(static_cast<std::size_t>(fabric.size()), 0),
        recvq_(static_cast<std::size_t>(fabric.size())) {}

  int rank() const { return rank_; }
  int size() const { return f_.size(); }
  double timeout_seconds() const { return f_.timeout_; }

  Request isend(int peer, const void* src, std::size_t bytes, const Signature& sig) {
    rethrow_if_aborted();
    auto& dst = f_.box(peer);
    {
      std::lock_guard<std::mutex> lk(dst.mu);
      dst.inbound[static_cast<std::size_t>(rank_)].push_back(
          {static_cast<const std::byte*>(src), bytes, sig});
    }
    dst.cv.notify_all();
    return {peer, true, sends_posted_[static_cast<std::size_t>(peer)]++};
  }

  Request irecv(int peer, void* dst, std::size_t bytes, const Signature& sig) {
    return post_recv(peer, dst, nullptr, bytes, ReduceSpec{}, sig);
  }

  Request irecv_reduce(int peer, void* dst, const void* local, std::size_t bytes,
                       const ReduceSpec& rs, const Signature& sig) {
    return post_recv(peer, dst, local, bytes, rs, sig);
  }

  bool done(Request r) const {
    const auto p = static_cast<std::size_t>(r.peer);
    return r.send ? me_.sends_done[p].load(std::memory_order_acquire) > r.seq
                  : recvs_done_[p] > r.seq;
  }

  bool test(Request r) {
    progress();
    return done(r);
  }

  void wait(Request r, const Deadline& dl) {
    while (!done(r)) block(dl);
  }

  // Blocks until an operation has completed since this last returned (see MeshTransport).
  void wait_any_progress(const Deadline& dl) {
    if (completions() == seen_) block(dl);
    seen_ = completions();
  }

  void abort(const Error& e) { f_.abort(e); }
  bool aborted() const { return f_.aborted(); }
  [[noreturn]] void rethrow() const {
    quiesce();
    f_.rethrow();
  }

  ~InprocTransport() {
    if (f_.aborted()) quiesce();
  }
  InprocTransport(const InprocTransport&) = delete;
  InprocTransport& operator=(const InprocTransport&) = delete;

 private:
  // After an abort: returns once no peer reads this rank's send buffers any more. Each peer's
  // mu is taken once, so a peer that saw the fabric not aborted under its mu has raised
  // `reading` by then, and one that takes its mu later sees the abort and reads nothing.
  void quiesce() const {
    for (int p = 0; p < f_.size(); ++p) {
      std::lock_guard<std::mutex> lk(f_.box(p).mu);
    }
    std::unique_lock<std::mutex> lk(me_.mu);
    me_.cv.wait(lk, [&] { return me_.reading.load(std::memory_order_acquire) == 0; });
  }
  void rethrow_if_aborted() const {
    if (f_.aborted()) rethrow();
  }

  static InprocFabric& check_rank(InprocFabric& f, int rank) {
    if (rank < 0 || rank >= f.size()) {
      throw ConfigError("InprocTransport: rank " + std::to_string(rank) +
                        " is not a rank of a fabric of size " + std::to_string(f.size()));
    }
    return f;
  }

  struct PendingRecv {
    std::byte* dst;
    const std::byte* local;  // nullptr: plain copy
    std::size_t bytes;
    ReduceSpec rs;
    Signature sig;
  };

  Request post_recv(int peer, void* dst, const void* local, std::size_t bytes, const ReduceSpec& rs,
                    const Signature& sig) {
    rethrow_if_aborted();
    const auto p = static_cast<std::size_t>(peer);
    recvq_[p].push_back(
        {static_cast<std::byte*>(dst), static_cast<const std::byte*>(local), bytes, rs, sig});
    ++pending_recvs_;
    const Request r{peer, false, recvs_posted_[p]++};
    progress();  // eager: the message may already be waiting
    return r;
  }

  std::uint64_t completions() const {
    return recv_completions_ + me_.send_completions.load(std::memory_order_acquire);
  }

  // Consumes every matched message: copy or reduce out of the sender's buffer, then complete
  // the sender's request.
  void progress() {
    rethrow_if_aborted();
    if (pending_recvs_ == 0) return;
    for (int p = 0; p < size(); ++p) {
      auto& q = recvq_[static_cast<std::size_t>(p)];
      while (!q.empty()) {
        InprocFabric::Send s;
        auto& sender = f_.box(p);
        bool aborted = false;
        {
          std::lock_guard<std::mutex> lk(me_.mu);
          auto& in = me_.inbound[static_cast<std::size_t>(p)];
          if (in.empty()) break;
          // Once aborted, the sender may be on its way out (quiesce): read nothing of it.
          aborted = f_.aborted_.load();
          if (!aborted) {
            s = in.front();
            in.pop_front();
            sender.reading.fetch_add(1, std::memory_order_relaxed);
          }
        }
        if (aborted) rethrow();
        const PendingRecv& r = q.front();
        if (s.sig != r.sig || s.bytes != r.bytes) {
          {
            std::lock_guard<std::mutex> lk(sender.mu);
            sender.reading.fetch_sub(1, std::memory_order_release);
          }
          sender.cv.notify_all();
          const MismatchError e("in-process: rank " + std::to_string(p) + " sent " +
                                std::to_string(s.bytes) + " bytes of " + s.sig.describe() +
                                ", rank " + std::to_string(rank_) + " expected " +
                                std::to_string(r.bytes) + " bytes of " + r.sig.describe());
          f_.abort(e);
          quiesce();
          throw e;
        }
        if (r.local != nullptr) {
          r.rs.fn(r.dst, r.local, s.src, s.bytes / r.rs.elem_size);
        } else if (s.bytes > 0) {
          std::memcpy(r.dst, s.src, s.bytes);
        }
        q.pop_front();
        --pending_recvs_;
        ++recvs_done_[static_cast<std::size_t>(p)];
        ++recv_completions_;
        {
          std::lock_guard<std::mutex> lk(sender.mu);
          sender.sends_done[static_cast<std::size_t>(rank_)].fetch_add(1,
                                                                       std::memory_order_release);
          sender.send_completions.fetch_add(1, std::memory_order_release);
          sender.reading.fetch_sub(1, std::memory_order_release);
        }
        sender.cv.notify_all();
      }
    }
  }

  bool inbound_ready_locked() const {
    for (std::size_t p = 0; p < recvq_.size(); ++p) {
      if (!recvq_[p].empty() && !me_.inbound[p].empty()) return true;
    }
    return false;
  }

  void block(const Deadline& dl) {
    const std::uint64_t before = completions();
    progress();
    if (completions() != before) return;
    if (f_.spin_) {
      const auto until = Clock::now() + std::chrono::microseconds(20);
      while (Clock::now() < until) {
        progress();
        if (completions() != before) return;
      }
    }
    std::unique_lock<std::mutex> lk(me_.mu);
    const auto ready = [&] {
      return f_.aborted_.load() || completions() != before || inbound_ready_locked();
    };
    const auto until = std::min(dl.time(), Clock::now() + std::chrono::milliseconds(200));
    if (!me_.cv.wait_until(lk, until, ready) && dl.expired()) {
      lk.unlock();
      const TimeoutError e("in-process rank " + std::to_string(rank_) + " timed out");
      f_.abort(e);
      quiesce();
      throw e;
    }
  }

  InprocFabric& f_;
  InprocFabric::RankBox& me_;
  int rank_;
  std::vector<std::uint64_t> sends_posted_, recvs_posted_, recvs_done_;
  std::vector<std::deque<PendingRecv>> recvq_;
  std::size_t pending_recvs_ = 0;
  std::uint64_t recv_completions_ = 0;
  std::uint64_t seen_ = 0;
};

static_assert(check_transport<InprocTransport>());

}  // namespace kolo
