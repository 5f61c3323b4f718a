// kolo/transport/mesh.hpp — the point-to-point engine behind ShmTransport, TcpTransport and
// RoutedTransport.
//
// One engine, three route policies. Each peer is reached either through shared memory (ranks
// with the same host key) or through an authenticated TCP connection, and one progress loop
// serves both, so a rank in a routed job can wait on a local slot and a remote socket at once
// without a helper thread. Why not two transports composed: the routed case would need two
// waits (futex and poll) and one of them would always be late. Here the shared-memory doorbell
// is a FIFO, so a single poll() sleeps on sockets, doorbell and peer process handles together.
//
// Shared memory: every rank owns one segment holding its control block and one inbound channel
// per local peer; a channel is a ring of K slots of S bytes (single producer, single consumer).
// The sender copies into a free slot and publishes it with a release store; the receiver copies
// or reduces straight out of the slot (irecv_reduce: no temporary) and frees it. Sleeping and
// waking: spin briefly (the ranks-per-core budget decides how long), then set `sleeping`, recheck,
// and poll(); a peer that publishes or frees a slot writes one byte to the sleeper's FIFO only
// when its `sleeping` flag is set (Dekker-style with seq_cst fences, so no wake-up is lost).
// A dead local peer is noticed through its pidfd, so a SIGKILL becomes PeerLostError at once,
// not after the timeout.
//
// TCP: one connection per peer pair, proven with the job secret (net/auth.hpp) before any data.
// A message is a BEGIN frame (total bytes and the sender's Signature) followed by DATA frames of
// at most 4 MiB; ABORT frames (error kind, origin rank, reason) can be inserted between frames,
// which is how an error on one rank reaches the others as the same exception.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/topology/bootstrap.hpp"
#include "kolo/transport/route.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

struct MeshOptions {
  std::size_t shm_slot_bytes = 256 * 1024;  // S: one copy unit; large enough for memcpy speed
  std::size_t shm_slots = 8;                // K: slots per channel (pipelining depth)
  double spin_us = -1;                      // < 0: decided from ranks per core
  std::size_t tcp_frame_bytes = 4 << 20;

  static MeshOptions from_env(const EnvLookup& env = process_env()) {
    MeshOptions o;
    if (auto v = env_int(env, "KOLO_SHM_SLOT_BYTES", 4096, 64ll << 20)) {
      o.shm_slot_bytes = static_cast<std::size_t>(*v) & ~std::size_t{63};
    }
    if (auto v = env_int(env, "KOLO_SHM_SLOTS", 2, 1024))
      o.shm_slots = static_cast<std::size_t>(*v);
    if (auto v = env_double(env, "KOLO_SPIN_US", 0, 1e6)) o.spin_us = *v;
    return o;
  }
};

namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();  // the builtin: <immintrin.h> alone costs ~0.6 s of compile time
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// ---- shared-memory layout ----

struct alignas(64) ShmSlotHeader {
  std::atomic<std::uint32_t> full;  // 0 free, 1 holds data: the only synchronising field
  std::uint32_t first;              // 1 on the first slot of a message
  std::uint64_t bytes;              // payload bytes in this slot
  std::uint64_t msg_bytes;          // total message bytes (first slot)
  std::uint64_t reserved;
  Signature sig;  // sender's view of the collective (first slot)
};
static_assert(sizeof(ShmSlotHeader) == 64);

struct alignas(64) ShmControl {
  std::atomic<std::uint32_t> sleeping;  // owner is (about to be) blocked in poll()
  std::uint32_t pad0[15];
  std::atomic<std::uint32_t> aborted;  // 0 no, 1 being written, 2 ready to read
  std::int32_t abort_kind;
  std::int32_t abort_origin;
  std::int32_t pid;
  char reason[2048];
};

inline constexpr std::size_t kShmControlBytes = 4096;
static_assert(sizeof(ShmControl) <= kShmControlBytes);

struct ShmMapping {
  void* base = nullptr;
  std::size_t bytes = 0;
  ShmMapping() = default;
  ShmMapping(const ShmMapping&) = delete;
  ShmMapping& operator=(const ShmMapping&) = delete;
  ~ShmMapping() {
    if (base) ::munmap(base, bytes);
  }
};

// ---- TCP framing ----

enum : std::uint32_t {
  kFrameBegin = 0x4b4c0001,
  kFrameData = 0x4b4c0002,
  kFrameAbort = 0x4b4c0003
};

struct FrameHeader {
  std::uint32_t type;
  std::uint32_t len;
};
struct BeginBody {
  std::uint64_t total;
  Signature sig;
};
static_assert(sizeof(FrameHeader) == 8 && sizeof(BeginBody) == 40);

// ---- operations ----

struct Op {
  enum class Kind : std::uint8_t { send, recv, recv_reduce };
  Kind kind = Kind::send;
  int peer = -1;
  const std::byte* src = nullptr;  // send: data; recv_reduce: local operand
  std::byte* dst = nullptr;        // recv, recv_reduce
  std::size_t bytes = 0;
  std::size_t done = 0;
  bool begun = false;  // header sent / received
  Signature sig;
  ReduceSpec rs;
  std::uint32_t gen = 0;    // bumped when the op completes: outstanding Requests see it as done
  std::uint32_t index = 0;  // position in the pool
};

}  // namespace detail

class MeshTransport {
 public:
  struct Request {
    std::uint32_t index = 0;
    std::uint32_t gen = 0;
  };

  MeshTransport(Bootstrap& boot, RouteMode mode, MeshOptions opts = MeshOptions::from_env())
      : rank_(boot.rank()),
        size_(boot.size()),
        mode_(mode),
        opts_(opts),
        timeout_(boot.topology().timeout_seconds),
        host_keys_(boot.host_keys()),
        peers_(static_cast<std::size_t>(boot.size())) {
    setup(boot);
  }

  // The factory (transport.hpp, Connectable): the route policy (KOLO_TRANSPORT) and the mesh's
  // variables, read before the rendezvous, then the connections.
  struct Options {
    RouteMode mode = RouteMode::routed;
    MeshOptions mesh;
    static Options from_env(const EnvLookup& env) {
      return {route_mode_from_env(env), MeshOptions::from_env(env)};
    }
  };
  static std::unique_ptr<MeshTransport> connect(Bootstrap& boot, const Options& o) {
    return std::make_unique<MeshTransport>(boot, o.mode, o.mesh);
  }

  MeshTransport(const MeshTransport&) = delete;
  MeshTransport& operator=(const MeshTransport&) = delete;

  ~MeshTransport() {
    if (aborted_) drain_tcp_before_close();
    for (auto& p : peers_) {
      if (p.fd >= 0) ::close(p.fd);
      if (p.bell_fd >= 0) ::close(p.bell_fd);
      if (p.pidfd >= 0) ::close(p.pidfd);
    }
    if (bell_fd_ >= 0) ::close(bell_fd_);
  }

  int rank() const { return rank_; }
  int size() const { return size_; }
  double timeout_seconds() const { return timeout_; }
  RouteMode mode() const { return mode_; }
  Route route(int peer) const { return peers_[static_cast<std::size_t>(peer)].route; }
  // How rank a reaches rank b, the same answer on every rank (from the host keys and the policy).
  Route route_between(int a, int b) const {
    if (a == b) return Route::self;
    if (mode_ == RouteMode::tcp_only) return Route::tcp;
    if (host_keys_[static_cast<std::size_t>(a)] == host_keys_[static_cast<std::size_t>(b)]) {
      return Route::shm;
    }
    return mode_ == RouteMode::routed ? Route::tcp : Route::shm;
  }
  int local_peer_count() const { return static_cast<int>(local_ranks_.size()); }

  // ---------------- posting ----------------

  Request isend(int peer, const void* src, std::size_t bytes, const Signature& sig) {
    auto& op = post(peer, detail::Op::Kind::send, sig, bytes);
    op.src = static_cast<const std::byte*>(src);
    return finish_post(op);
  }

  Request irecv(int peer, void* dst, std::size_t bytes, const Signature& sig) {
    auto& op = post(peer, detail::Op::Kind::recv, sig, bytes);
    op.dst = static_cast<std::byte*>(dst);
    return finish_post(op);
  }

  Request irecv_reduce(int peer, void* dst, const void* local, std::size_t bytes,
                       const ReduceSpec& rs, const Signature& sig) {
    auto& op = post(peer, detail::Op::Kind::recv_reduce, sig, bytes);
    op.dst = static_cast<std::byte*>(dst);
    op.src = static_cast<const std::byte*>(local);
    op.rs = rs;
    if (bytes % rs.elem_size != 0) {
      throw Error("irecv_reduce: byte count " + std::to_string(bytes) +
                  " is not a multiple of the element size");
    }
    return finish_post(op);
  }

  // ---------------- completion ----------------

  bool done(Request r) const { return ops_[r.index].gen != r.gen; }

  bool test(Request r) {
    if (done(r)) return true;
    progress();
    return done(r);
  }

  void wait(Request r, const Deadline& dl) {
    while (!done(r)) block(dl);
  }

  template <class Range>
  void wait_all(const Range& reqs, const Deadline& dl) {
    for (const Request& r : reqs) wait(r, dl);
  }

  // Blocks until at least one operation has completed since this last returned (or none is
  // pending). "Since this last returned", not "from now": an operation may complete inside an
  // isend/irecv call (eager progress), and a caller that then waits must not miss it.
  void wait_any_progress(const Deadline& dl) {
    if (completions_ == seen_completions_) block(dl);
    seen_completions_ = completions_;
  }

  // ---------------- errors ----------------

  [[noreturn]] void rethrow() const { throw_error(error_kind_, error_what_); }

  // Records err as this transport's fatal error and tells every peer (best effort, bounded).
  void abort(const Error& err) {
    if (aborted_) return;
    aborted_ = true;
    error_kind_ = err.kind();
    error_what_ = err.what();
    const int origin = abort_origin_ >= 0 ? abort_origin_ : rank_;
    const std::string reason = err.what();
    for (int p = 0; p < size_; ++p) {
      auto& peer = peers_[static_cast<std::size_t>(p)];
      if (peer.route == Route::shm) {
        auto* ctrl = peer.peer_ctrl;
        std::uint32_t expect = 0;
        if (ctrl && ctrl->aborted.compare_exchange_strong(expect, 1)) {
          ctrl->abort_kind = static_cast<std::int32_t>(err.kind());
          ctrl->abort_origin = origin;
          const std::size_t n = std::min(reason.size(), sizeof(ctrl->reason) - 1);
          std::memcpy(ctrl->reason, reason.data(), n);
          ctrl->reason[n] = '\0';
          ctrl->aborted.store(2, std::memory_order_release);
        }
        ring(peer, true);
      } else if (peer.route == Route::tcp && peer.fd >= 0 && !peer.closed) {
        tcp_send_abort(peer, err.kind(), origin, reason);
      }
    }
  }

  bool aborted() const { return aborted_; }

  // Non-blocking: makes progress and throws this transport's error if it has been aborted
  // here or by a peer, or a peer has gone. For callers that wait on something else (a CUDA
  // stream, an NCCL kernel) and must still notice a failing job.
  void poll() {
    if (aborted_) rethrow();
    progress();
    if (aborted_) rethrow();
  }

 private:
  // After an abort a peer may still be sending us the rest of a message. Closing a socket with
  // unread bytes makes the kernel send a reset and throw away what we had queued for the peer,
  // which can be the ABORT frame telling it why (it would then report "rank R exited" instead
  // of the real error). So read and discard until each peer closes too — it does as soon as it
  // has read our ABORT — for at most one second in all.
  void drain_tcp_before_close() noexcept {
    const Deadline dl = Deadline::after(1.0);
    std::vector<pollfd> fds;
    for (const auto& p : peers_) {
      if (p.route == Route::tcp && p.fd >= 0 && !p.closed) fds.push_back({p.fd, POLLIN, 0});
    }
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

  struct Peer {
    Route route = Route::self;
    std::deque<std::uint32_t> sendq, recvq;
    // shm
    std::byte* out_channel = nullptr;  // my channel inside the peer's segment
    std::byte* in_channel = nullptr;   // the peer's channel inside my segment
    std::uint64_t head = 0, tail = 0;
    detail::ShmControl* peer_ctrl = nullptr;
    std::shared_ptr<detail::ShmMapping> mapping;
    int bell_fd = -1;
    int pidfd = -1;
    int pid = 0;
    bool dead = false;
    // tcp
    int fd = -1;
    bool closed = false;
    bool want_out = false;      // the last send hit EAGAIN
    bool data_waiting = false;  // a frame for a not-yet-posted receive is queued on the socket
    unsigned char tx_hdr[2 * sizeof(detail::FrameHeader) + sizeof(detail::BeginBody)] = {};
    std::size_t tx_hdr_len = 0, tx_hdr_off = 0, tx_frame_left = 0;
    std::uint32_t rx_type = 0;  // frame being parsed (0: expecting a header)
    std::size_t rx_left = 0;    // bytes left in the current frame's body
    // Buffered receive: one recv() brings in headers and small payloads together; large payloads
    // bypass the buffer and land straight in the destination.
    std::vector<std::byte> rx;
    std::size_t rx_beg = 0, rx_end = 0;
    std::string abort_body;
  };

  // ---------------- setup ----------------

  void setup(Bootstrap& boot) {
    const Topology& topo = boot.topology();
    spin_us_ = opts_.spin_us;
    if (spin_us_ < 0) {
      // Spinning only pays while every rank of this host has its own core; otherwise it steals
      // the core the peer needs to produce the data we wait for.
      const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
      spin_us_ = static_cast<unsigned>(topo.local_size) <= cores ? 50.0 : 2.0;
    }
    bool need_tcp = false, need_shm = false;
    for (int p = 0; p < size_; ++p) {
      auto& peer = peers_[static_cast<std::size_t>(p)];
      if (p == rank_) {
        peer.route = Route::self;
      } else if (mode_ == RouteMode::tcp_only) {
        peer.route = Route::tcp;
      } else if (boot.same_host(p)) {
        peer.route = Route::shm;
      } else if (mode_ == RouteMode::routed) {
        peer.route = Route::tcp;
      } else {
        throw ConfigError("ShmTransport needs every rank on one host, but rank " +
                          std::to_string(p) + " is on host '" +
                          boot.host_keys()[static_cast<std::size_t>(p)] + "' and rank " +
                          std::to_string(rank_) + " on '" + topo.host_key +
                          "': use RoutedTransport (KOLO_TRANSPORT=routed) or TcpTransport");
      }
      need_tcp |= peer.route == Route::tcp;
      need_shm |= peer.route == Route::shm;
    }
    if (size_ == 1) return;
    const Deadline dl = Deadline::after(timeout_);

    net::Socket listener;
    std::string my_addr = "-";
    if (need_tcp) {
      if (topo.listen_fd >= 0) {
        listener = net::Socket(topo.listen_fd);
      } else {
        listener = net::listen_tcp("0.0.0.0", 0);
      }
      my_addr = boot.advertised_ip() + ":" + std::to_string(net::local_port(listener.fd()));
    }
    const std::string token = boot.job_token();
    const auto infos = boot.allgather("mesh", std::to_string(::getpid()) + "|" + my_addr);
    for (int p = 0; p < size_; ++p) {
      const std::string& info = infos[static_cast<std::size_t>(p)];
      const auto bar = info.find('|');
      peers_[static_cast<std::size_t>(p)].pid = std::stoi(info.substr(0, bar));
    }

    // Barriers are entered by every rank, with or without local peers, or they would not meet.
    if (need_shm) create_shm(token);
    boot.barrier("shm-created");
    if (need_shm) map_peers_shm(token);
    if (need_tcp) setup_tcp(boot, std::move(listener), infos, dl);
    boot.barrier("mesh-ready");
    if (need_shm) {
      // Everyone has mapped everything: remove the names so a crash cannot leak them.
      ::shm_unlink(shm_name(token, rank_).c_str());
      ::unlink(bell_path(token, rank_).c_str());
    }
  }

  static std::string shm_name(const std::string& token, int r) {
    return "/kolo-" + token + "-" + std::to_string(r);
  }
  static std::string bell_path(const std::string& token, int r) {
    return "/dev/shm/kolo-" + token + "-" + std::to_string(r) + ".bell";
  }

  std::size_t channel_bytes() const {
    return opts_.shm_slots * (sizeof(detail::ShmSlotHeader) + opts_.shm_slot_bytes);
  }
  std::size_t segment_bytes() const {
    return detail::kShmControlBytes + local_ranks_.size() * channel_bytes();
  }
  detail::ShmSlotHeader* slot(std::byte* channel, std::uint64_t i) const {
    return reinterpret_cast<detail::ShmSlotHeader*>(
        channel + (i % opts_.shm_slots) * (sizeof(detail::ShmSlotHeader) + opts_.shm_slot_bytes));
  }

  static std::shared_ptr<detail::ShmMapping> map_segment(const std::string& name, std::size_t bytes,
                                                         bool create) {
    const int fd = ::shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
    if (fd < 0) {
      throw Error("shm_open(" + name + ") failed: " + net::errno_text(errno) +
                  (create ? " (is /dev/shm mounted and writable?)" : ""));
    }
    if (create && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int err = errno;
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw Error("cannot size shared memory " + name + " to " + std::to_string(bytes) +
                  " bytes: " + net::errno_text(err) + " (is /dev/shm large enough?)");
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) throw Error("mmap of " + name + " failed: " + net::errno_text(errno));
    auto m = std::make_shared<detail::ShmMapping>();
    m->base = p;
    m->bytes = bytes;
    return m;
  }

  void create_shm(const std::string& token) {
    local_index_.assign(static_cast<std::size_t>(size_), -1);
    for (int p = 0; p < size_; ++p) {
      if (p == rank_ || peers_[static_cast<std::size_t>(p)].route == Route::shm) {
        local_index_[static_cast<std::size_t>(p)] = static_cast<int>(local_ranks_.size());
        local_ranks_.push_back(p);
      }
    }
    const std::string name = shm_name(token, rank_);
    own_ = map_segment(name, segment_bytes(), true);
    ctrl_ = new (own_->base) detail::ShmControl();
    ctrl_->pid = static_cast<std::int32_t>(::getpid());
    const std::string bell = bell_path(token, rank_);
    if (::mkfifo(bell.c_str(), 0600) != 0) {
      throw Error("mkfifo(" + bell + ") failed: " + net::errno_text(errno));
    }
    // O_RDWR: opening never blocks and the FIFO never reports EOF while we hold it.
    bell_fd_ = ::open(bell.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (bell_fd_ < 0) throw Error("open(" + bell + ") failed: " + net::errno_text(errno));
  }

  void map_peers_shm(const std::string& token) {
    const int me = local_index_[static_cast<std::size_t>(rank_)];
    for (int p : local_ranks_) {
      if (p == rank_) continue;
      auto& peer = peers_[static_cast<std::size_t>(p)];
      const int them = local_index_[static_cast<std::size_t>(p)];
      peer.mapping = map_segment(shm_name(token, p), segment_bytes(), false);
      auto* base = static_cast<std::byte*>(peer.mapping->base);
      peer.peer_ctrl = reinterpret_cast<detail::ShmControl*>(base);
      peer.out_channel =
          base + detail::kShmControlBytes + static_cast<std::size_t>(me) * channel_bytes();
      peer.in_channel = static_cast<std::byte*>(own_->base) + detail::kShmControlBytes +
                        static_cast<std::size_t>(them) * channel_bytes();
      // O_RDWR, not O_WRONLY: holding a read end ourselves means the FIFO never loses its last
      // reader, so ringing a peer that has exited (e.g. after it aborted) cannot raise SIGPIPE
      // and kill this rank before it reports the error; unread bytes just fill the pipe (EAGAIN).
      peer.bell_fd = ::open(bell_path(token, p).c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
      if (peer.bell_fd < 0) {
        throw Error("cannot open the doorbell of rank " + std::to_string(p) + ": " +
                    net::errno_text(errno));
      }
#ifdef SYS_pidfd_open
      peer.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, peer.pid, 0));
#endif
    }
  }

  void setup_tcp(Bootstrap& boot, net::Socket listener, const std::vector<std::string>& infos,
                 const Deadline& dl) {
    const std::string secret = boot.topology().secret;
    // Higher ranks connect to lower ones; an acceptor thread serves the handshakes of the
    // higher ranks meanwhile, all of them at once, so a silent stranger stalls nobody.
    std::vector<int> expect;
    for (int p = rank_ + 1; p < size_; ++p) {
      if (peers_[static_cast<std::size_t>(p)].route == Route::tcp) expect.push_back(p);
    }
    std::vector<int> accepted_fd(static_cast<std::size_t>(size_), -1);
    std::exception_ptr accept_error;
    std::thread acceptor([&] {
      try {
        accept_peers(listener.fd(), secret, expect, accepted_fd, dl);
      } catch (...) {
        accept_error = std::current_exception();
      }
    });
    std::exception_ptr connect_error;
    try {
      for (int p = 0; p < rank_; ++p) {
        auto& peer = peers_[static_cast<std::size_t>(p)];
        if (peer.route != Route::tcp) continue;
        const std::string& info = infos[static_cast<std::size_t>(p)];
        const auto hp = net::parse_host_port(info.substr(info.find('|') + 1),
                                             "address of rank " + std::to_string(p));
        const std::string who = "rank " + std::to_string(p) + " (" + hp.str() + ")";
        net::Socket s = net::connect_tcp(hp.host, hp.port, dl, who);
        net::authenticate_client(s.fd(), secret, net::Hello{net::kPurposeData, rank_, 0}, dl, who);
        peer.fd = s.release();
      }
    } catch (...) {
      connect_error = std::current_exception();
      stop_accepting_.store(true);
    }
    acceptor.join();
    if (connect_error) std::rethrow_exception(connect_error);
    if (accept_error) std::rethrow_exception(accept_error);
    for (int p : expect)
      peers_[static_cast<std::size_t>(p)].fd = accepted_fd[static_cast<std::size_t>(p)];
    for (auto& peer : peers_) {
      if (peer.route != Route::tcp) continue;
      net::set_nonblocking(peer.fd, true);
      net::set_nodelay(peer.fd);
      peer.rx.resize(256 * 1024);
    }
    // The listener closes with `listener` here: later strangers are refused by the kernel.
  }

  void accept_peers(int lfd, const std::string& secret, const std::vector<int>& expect,
                    std::vector<int>& out, const Deadline& dl) {
    std::size_t missing = expect.size();
    struct Pending {
      net::Socket sock;
      std::unique_ptr<net::ServerHandshake> hs;
      Deadline until;
    };
    std::vector<Pending> pending;
    net::set_nonblocking(lfd, true);
    while (missing > 0) {
      if (stop_accepting_.load()) return;
      if (dl.expired()) {
        std::string who;
        for (int p : expect) {
          if (out[static_cast<std::size_t>(p)] < 0)
            who += (who.empty() ? "" : ", ") + std::to_string(p);
        }
        throw TimeoutError("rank " + std::to_string(rank_) +
                           " timed out waiting for TCP connections from rank(s) " + who +
                           " (KOLO_TIMEOUT_SECONDS=" + std::to_string(timeout_) + ")");
      }
      std::vector<pollfd> fds;
      fds.push_back({lfd, POLLIN, 0});
      for (auto& pc : pending) fds.push_back({pc.sock.fd(), POLLIN, 0});
      const int rc = ::poll(fds.data(), fds.size(), dl.remaining_ms(100));
      if (rc < 0 && errno != EINTR) throw Error("poll failed: " + net::errno_text(errno));
      if (fds[0].revents & POLLIN) {
        const int fd = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd >= 0) {
          Pending pc{net::Socket(fd), nullptr, Deadline::after(10.0).earlier(dl)};
          try {
            pc.hs = std::make_unique<net::ServerHandshake>(fd, secret);
            pending.push_back(std::move(pc));
          } catch (const Error&) {  // could not even send the challenge: drop it
          }
        }
      }
      for (std::size_t i = 0; i < pending.size();) {
        bool drop = false;
        const short rev = i + 1 < fds.size() ? fds[i + 1].revents : 0;
        if (rev) {
          try {
            if (pending[i].hs->on_readable()) {
              const net::Hello h = pending[i].hs->hello();
              const bool wanted = h.purpose == net::kPurposeData &&
                                  std::find(expect.begin(), expect.end(), h.rank) != expect.end() &&
                                  out[static_cast<std::size_t>(h.rank)] < 0;
              if (wanted) {
                out[static_cast<std::size_t>(h.rank)] = pending[i].sock.release();
                --missing;
              }
              drop = true;  // accepted (fd moved out) or an authenticated but unexpected client
            }
          } catch (const Error&) {
            drop = true;  // wrong secret, garbage, or closed: refuse silently
          }
        } else if (pending[i].until.expired()) {
          drop = true;  // silent stranger
        }
        if (drop) {
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        } else {
          ++i;
        }
      }
    }
  }

  // ---------------- op bookkeeping ----------------

  detail::Op& post(int peer, detail::Op::Kind kind, const Signature& sig, std::size_t bytes) {
    if (aborted_) rethrow();
    if (peer < 0 || peer >= size_ || peer == rank_) {
      throw Error("invalid peer rank " + std::to_string(peer) + " (this is rank " +
                  std::to_string(rank_) + " of " + std::to_string(size_) + ")");
    }
    std::uint32_t idx;
    if (!free_.empty()) {
      idx = free_.back();
      free_.pop_back();
    } else {
      idx = static_cast<std::uint32_t>(ops_.size());
      ops_.emplace_back();
    }
    detail::Op& op = ops_[idx];
    const std::uint32_t gen = op.gen;
    op = detail::Op{};
    op.gen = gen;
    op.index = idx;
    op.kind = kind;
    op.peer = peer;
    op.sig = sig;
    op.bytes = bytes;
    auto& p = peers_[static_cast<std::size_t>(peer)];
    (kind == detail::Op::Kind::send ? p.sendq : p.recvq).push_back(idx);
    ++pending_;
    return op;
  }

  Request finish_post(detail::Op& op) {
    Request r{op.index, op.gen};
    // Start eagerly: small messages usually complete here without ever blocking.
    try {
      progress_peer(op.peer);
    } catch (const Error& e) {
      fail(e);
    }
    return r;
  }

  void complete(Peer& peer, bool send) {
    auto& q = send ? peer.sendq : peer.recvq;
    const std::uint32_t idx = q.front();
    q.pop_front();
    ++ops_[idx].gen;
    free_.push_back(idx);
    --pending_;
    ++completions_;
  }

  [[noreturn]] void fail(const Error& e) {
    abort(e);
    rethrow();
  }

  // ---------------- progress ----------------

  void progress() {
    try {
      check_abort_flag();
      for (int p = 0; p < size_; ++p) progress_peer(p);
    } catch (const Error& e) {
      fail(e);
    }
  }

  void check_abort_flag() {
    if (ctrl_ && ctrl_->aborted.load(std::memory_order_acquire) == 2) {
      abort_origin_ = ctrl_->abort_origin;
      throw_remote(static_cast<ErrorKind>(ctrl_->abort_kind), ctrl_->abort_origin,
                   std::string(ctrl_->reason));
    }
  }

  [[noreturn]] void throw_remote(ErrorKind kind, int origin, const std::string& reason) {
    abort_origin_ = origin;
    // The reason comes off the wire: a NUL in it would cut what() short (losing the tag below)
    // and control bytes would garble logs, so they are shown as '?'.
    std::string msg = reason;
    for (char& c : msg) {
      const auto u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) c = '?';
    }
    const std::string tag = "[reported by rank " + std::to_string(origin) + "]";
    if (msg.find("[reported by rank") == std::string::npos) msg += " " + tag;
    throw_error(kind, msg);
  }

  void progress_peer(int p) {
    auto& peer = peers_[static_cast<std::size_t>(p)];
    if (peer.route == Route::shm) {
      if (!peer.sendq.empty()) shm_send(peer);
      if (!peer.recvq.empty()) shm_recv(peer);
    } else if (peer.route == Route::tcp) {
      if (!peer.sendq.empty()) tcp_send(peer, p);
      tcp_recv(peer, p);
    }
  }

  void ring(Peer& peer, bool force = false) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (peer.bell_fd >= 0 &&
        (force || peer.peer_ctrl->sleeping.load(std::memory_order_relaxed) != 0)) {
      const char b = 1;
      [[maybe_unused]] const ssize_t k = ::write(peer.bell_fd, &b, 1);  // EAGAIN: already rung
    }
  }

  std::string peer_desc(int p) const {
    return "rank " + std::to_string(p) + " (" +
           route_name(peers_[static_cast<std::size_t>(p)].route) + ")";
  }

  [[noreturn]] void peer_died(int p, const detail::Op& op) {
    throw PeerLostError("rank " + std::to_string(p) + " (pid " +
                        std::to_string(peers_[static_cast<std::size_t>(p)].pid) +
                        ") exited or was killed during " + op.sig.describe() +
                        "; detected by rank " + std::to_string(rank_));
  }

  [[noreturn]] void mismatch(int p, const Signature& theirs, std::uint64_t their_bytes,
                             const detail::Op& op) {
    if (theirs == op.sig) {
      throw MismatchError("message size mismatch in " + op.sig.describe() + ": rank " +
                          std::to_string(p) + " sent " + std::to_string(their_bytes) +
                          " bytes, rank " + std::to_string(rank_) + " expected " +
                          std::to_string(op.bytes));
    }
    throw MismatchError("collective mismatch: rank " + std::to_string(p) + " called " +
                        theirs.describe() + " but rank " + std::to_string(rank_) + " called " +
                        op.sig.describe());
  }

  void shm_send(Peer& peer) {
    bool published = false;
    while (!peer.sendq.empty()) {
      detail::Op& op = ops_[peer.sendq.front()];
      if (peer.dead) peer_died(op.peer, op);
      while (op.done < op.bytes || !op.begun) {
        detail::ShmSlotHeader* s = slot(peer.out_channel, peer.head);
        if (s->full.load(std::memory_order_acquire) != 0) break;  // ring full: wait
        const std::size_t n = std::min(opts_.shm_slot_bytes, op.bytes - op.done);
        // n == 0 (an empty message) may come with a null src: memcpy must not see it (UB).
        if (n > 0) std::memcpy(reinterpret_cast<std::byte*>(s + 1), op.src + op.done, n);
        s->bytes = n;
        s->first = op.begun ? 0 : 1;
        if (!op.begun) {
          s->msg_bytes = op.bytes;
          s->sig = op.sig;
          op.begun = true;
        }
        s->full.store(1, std::memory_order_release);
        ++peer.head;
        op.done += n;
        published = true;
      }
      if (op.done < op.bytes || !op.begun) break;
      complete(peer, true);
    }
    if (published) ring(peer);
  }

  void shm_recv(Peer& peer) {
    bool freed = false;
    while (!peer.recvq.empty()) {
      detail::Op& op = ops_[peer.recvq.front()];
      while (op.done < op.bytes || !op.begun) {
        detail::ShmSlotHeader* s = slot(peer.in_channel, peer.tail);
        if (s->full.load(std::memory_order_acquire) == 0) {
          if (peer.dead) peer_died(op.peer, op);
          break;
        }
        if (!op.begun) {
          if (!s->first || s->sig != op.sig || s->msg_bytes != op.bytes) {
            if (!s->first) throw Error("shared-memory protocol error from " + peer_desc(op.peer));
            mismatch(op.peer, s->sig, s->msg_bytes, op);
          }
          op.begun = true;
        }
        const std::size_t n = s->bytes;
        const auto* data = reinterpret_cast<const std::byte*>(s + 1);
        if (op.kind == detail::Op::Kind::recv) {
          if (n > 0) std::memcpy(op.dst + op.done, data, n);  // dst may be null when n == 0
        } else {
          op.rs.fn(op.dst + op.done, op.src + op.done, data, n / op.rs.elem_size);
        }
        s->full.store(0, std::memory_order_release);
        ++peer.tail;
        op.done += n;
        freed = true;
      }
      if (op.done < op.bytes || !op.begun) break;
      complete(peer, false);
    }
    if (freed) ring(peer);
  }

  // ---- TCP ----

  void tcp_send(Peer& peer, int p) {
    peer.want_out = false;
    while (!peer.sendq.empty()) {
      detail::Op& op = ops_[peer.sendq.front()];
      if (peer.closed) peer_died(p, op);
      if (!op.begun) {
        // BEGIN and the first DATA header go out with the first payload bytes in one sendmsg.
        detail::FrameHeader h{detail::kFrameBegin, sizeof(detail::BeginBody)};
        detail::BeginBody b{op.bytes, op.sig};
        std::memcpy(peer.tx_hdr, &h, sizeof(h));
        std::memcpy(peer.tx_hdr + sizeof(h), &b, sizeof(b));
        peer.tx_hdr_len = sizeof(h) + sizeof(b);
        peer.tx_hdr_off = 0;
        peer.tx_frame_left = 0;
        if (op.bytes > 0) {
          const std::size_t n = std::min(opts_.tcp_frame_bytes, op.bytes);
          detail::FrameHeader d{detail::kFrameData, static_cast<std::uint32_t>(n)};
          std::memcpy(peer.tx_hdr + peer.tx_hdr_len, &d, sizeof(d));
          peer.tx_hdr_len += sizeof(d);
          peer.tx_frame_left = n;
        }
        op.begun = true;
      }
      for (;;) {
        if (peer.tx_hdr_off == peer.tx_hdr_len && peer.tx_frame_left == 0) {
          if (op.done == op.bytes) break;
          const std::size_t n = std::min(opts_.tcp_frame_bytes, op.bytes - op.done);
          detail::FrameHeader h{detail::kFrameData, static_cast<std::uint32_t>(n)};
          std::memcpy(peer.tx_hdr, &h, sizeof(h));
          peer.tx_hdr_len = sizeof(h);
          peer.tx_hdr_off = 0;
          peer.tx_frame_left = n;
        }
        iovec iov[2];
        int cnt = 0;
        if (peer.tx_hdr_off < peer.tx_hdr_len) {
          iov[cnt++] = {peer.tx_hdr + peer.tx_hdr_off, peer.tx_hdr_len - peer.tx_hdr_off};
        }
        if (peer.tx_frame_left > 0) {
          iov[cnt++] = {const_cast<std::byte*>(op.src + op.done), peer.tx_frame_left};
        }
        msghdr msg{};
        msg.msg_iov = iov;
        msg.msg_iovlen = static_cast<std::size_t>(cnt);
        const ssize_t k = ::sendmsg(peer.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) {
            peer.want_out = true;
            return;
          }
          const int err = errno;
          // The peer closed its socket. One that fails sends an ABORT frame first and then
          // exits, so if we merely lost the race to read it, the frame is queued on our side:
          // throw that (the real error, e.g. a MismatchError, on this rank as on the others)
          // rather than report a lost connection here.
          tcp_rethrow_queued_abort(peer, p);
          peer.closed = true;
          throw PeerLostError("connection to rank " + std::to_string(p) + " lost during " +
                              op.sig.describe() + ": " + net::errno_text(err) +
                              "; detected by rank " + std::to_string(rank_));
        }
        std::size_t sent = static_cast<std::size_t>(k);
        const std::size_t h = std::min(sent, peer.tx_hdr_len - peer.tx_hdr_off);
        peer.tx_hdr_off += h;
        sent -= h;
        peer.tx_frame_left -= sent;
        op.done += sent;
      }
      complete(peer, true);
    }
  }

  // Reads what the socket has into the receive buffer; false when nothing came (would block,
  // or the peer closed: `closed` says which).
  bool tcp_fill(Peer& peer) {
    if (peer.rx_beg == peer.rx_end) peer.rx_beg = peer.rx_end = 0;
    if (peer.rx_end == peer.rx.size()) {  // compact: keep the unparsed tail at the front
      std::memmove(peer.rx.data(), peer.rx.data() + peer.rx_beg, peer.rx_end - peer.rx_beg);
      peer.rx_end -= peer.rx_beg;
      peer.rx_beg = 0;
    }
    if (peer.rx_end == peer.rx.size()) return true;  // full of unparsed bytes: parse first
    if (peer.closed) return false;
    for (;;) {
      const ssize_t k =
          ::recv(peer.fd, peer.rx.data() + peer.rx_end, peer.rx.size() - peer.rx_end, MSG_DONTWAIT);
      if (k > 0) {
        peer.rx_end += static_cast<std::size_t>(k);
        return true;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      peer.closed = true;  // EOF or reset: an error only if an operation still needs this peer
      return false;
    }
  }

  // A send failed because the peer closed: if the peer told us why first (an ABORT frame waiting
  // in our receive buffer or socket at a frame boundary), throw that instead of "peer lost".
  void tcp_rethrow_queued_abort(Peer& peer, int p) {
    if (peer.rx_type != 0 || peer.rx.empty()) return;
    for (;;) {  // drain what the kernel still holds, up to the buffer's room
      if (peer.rx_beg == peer.rx_end) peer.rx_beg = peer.rx_end = 0;
      if (peer.rx_end == peer.rx.size()) break;
      const ssize_t k =
          ::recv(peer.fd, peer.rx.data() + peer.rx_end, peer.rx.size() - peer.rx_end, MSG_DONTWAIT);
      if (k > 0) {
        peer.rx_end += static_cast<std::size_t>(k);
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      break;
    }
    const std::size_t avail = peer.rx_end - peer.rx_beg;
    if (avail < sizeof(detail::FrameHeader)) return;
    detail::FrameHeader h;
    std::memcpy(&h, peer.rx.data() + peer.rx_beg, sizeof(h));
    if (h.type != detail::kFrameAbort || h.len < 8 || avail < sizeof(h) + h.len) return;
    const char* body = reinterpret_cast<const char*>(peer.rx.data() + peer.rx_beg + sizeof(h));
    std::int32_t kind = 1, origin = p;
    std::memcpy(&kind, body, 4);
    std::memcpy(&origin, body + 4, 4);
    throw_remote(static_cast<ErrorKind>(kind), origin, std::string(body + 8, h.len - 8));
  }

  // Reads straight into dst (large payloads skip the buffer); false when nothing came.
  bool tcp_read_direct(Peer& peer, std::byte* dst, std::size_t n, std::size_t& got) {
    for (;;) {
      const ssize_t k = ::recv(peer.fd, dst, n, MSG_DONTWAIT);
      if (k > 0) {
        got = static_cast<std::size_t>(k);
        return true;
      }
      if (k < 0 && errno == EINTR) continue;
      if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) peer.closed = true;
      return false;
    }
  }

  void tcp_recv(Peer& peer, int p) {
    if (!peer.recvq.empty()) peer.data_waiting = false;
    if (peer.data_waiting) return;  // a frame waits for a receive not yet posted
    for (;;) {
      std::size_t avail = peer.rx_end - peer.rx_beg;
      const std::byte* buf = peer.rx.data() + peer.rx_beg;
      auto need_more = [&]() {
        if (tcp_fill(peer)) return true;
        if (peer.closed) tcp_closed(peer, p);
        return false;
      };
      if (peer.rx_type == 0) {  // frame header
        if (avail < sizeof(detail::FrameHeader)) {
          if (!need_more()) return;
          continue;
        }
        detail::FrameHeader h;
        std::memcpy(&h, buf, sizeof(h));
        if (h.type != detail::kFrameAbort && peer.recvq.empty()) {
          peer.data_waiting = true;  // leave it buffered until its receive is posted
          return;
        }
        peer.rx_beg += sizeof(h);
        peer.rx_type = h.type;
        peer.rx_left = h.len;
        if (h.type == detail::kFrameAbort) {
          if (h.len > 65536) throw Error("TCP protocol error from rank " + std::to_string(p));
          peer.abort_body.clear();
        } else if (h.type == detail::kFrameBegin) {
          if (h.len != sizeof(detail::BeginBody)) {
            throw Error("TCP protocol error from rank " + std::to_string(p) + " (bad BEGIN)");
          }
        } else if (h.type == detail::kFrameData) {
          const detail::Op& op = ops_[peer.recvq.front()];
          if (!op.begun) {
            throw Error("TCP protocol error from rank " + std::to_string(p) +
                        " (DATA before BEGIN)");
          }
          // A frame longer than what is left of the message would never let the receive
          // complete (and, with more bytes queued behind it, spin on a full buffer).
          if (h.len > op.bytes - op.done) {
            throw Error("TCP protocol error from rank " + std::to_string(p) + " (DATA frame of " +
                        std::to_string(h.len) + " bytes, " + std::to_string(op.bytes - op.done) +
                        " left in the message)");
          }
          // A reducing receive folds whole elements: a frame that ends inside one leaves a
          // fragment no later frame can complete, and the loop below would spin on it.
          if (op.kind == detail::Op::Kind::recv_reduce && h.len % op.rs.elem_size != 0) {
            throw Error("TCP protocol error from rank " + std::to_string(p) + " (DATA frame of " +
                        std::to_string(h.len) + " bytes splits a " +
                        std::to_string(op.rs.elem_size) + "-byte element)");
          }
        } else {
          throw Error("TCP protocol error from rank " + std::to_string(p) + " (bad frame type)");
        }
        continue;
      }
      if (peer.rx_type == detail::kFrameAbort) {
        const std::size_t n = std::min(avail, peer.rx_left);
        peer.abort_body.append(reinterpret_cast<const char*>(buf), n);
        peer.rx_beg += n;
        peer.rx_left -= n;
        if (peer.rx_left > 0) {
          if (!need_more()) return;
          continue;
        }
        std::int32_t kind = 1, origin = p;
        std::string reason;
        if (peer.abort_body.size() >= 8) {
          std::memcpy(&kind, peer.abort_body.data(), 4);
          std::memcpy(&origin, peer.abort_body.data() + 4, 4);
          reason = peer.abort_body.substr(8);
        }
        peer.closed = true;
        throw_remote(static_cast<ErrorKind>(kind), origin, reason);
      }
      detail::Op& op = ops_[peer.recvq.front()];
      if (peer.rx_type == detail::kFrameBegin) {
        if (avail < sizeof(detail::BeginBody)) {
          if (!need_more()) return;
          continue;
        }
        detail::BeginBody b;
        std::memcpy(&b, buf, sizeof(b));
        peer.rx_beg += sizeof(b);
        peer.rx_type = 0;
        if (b.sig != op.sig || b.total != op.bytes) mismatch(p, b.sig, b.total, op);
        op.begun = true;
        if (op.bytes == 0) {
          complete(peer, false);
          if (peer.recvq.empty()) return;
        }
        continue;
      }
      // DATA payload for the op at the head of the queue.
      if (peer.rx_left == 0) {
        peer.rx_type = 0;
        continue;
      }
      const std::size_t want = std::min(peer.rx_left, op.bytes - op.done);
      const bool reduce = op.kind == detail::Op::Kind::recv_reduce;
      if (avail > 0) {
        std::size_t n = std::min(avail, want);
        if (reduce) n = n / op.rs.elem_size * op.rs.elem_size;  // whole elements only
        if (n == 0) {                                           // a partial element: fetch the rest
          // A full buffer is compacted first, and whatever that fill reads must be parsed
          // before asking again: the next read may see the peer's EOF, and the peer may have
          // closed right after sending the rest (a correct sender does), which must not count
          // as a lost peer while the message is complete in the buffer.
          if (peer.rx_end == peer.rx.size() && tcp_fill(peer)) continue;
          if (!need_more()) return;
          continue;
        }
        if (reduce) {
          op.rs.fn(op.dst + op.done, op.src + op.done, buf, n / op.rs.elem_size);
        } else {
          std::memcpy(op.dst + op.done, buf, n);
        }
        peer.rx_beg += n;
        op.done += n;
        peer.rx_left -= n;
      } else if (!reduce && want >= 16384) {
        std::size_t got = 0;
        if (!tcp_read_direct(peer, op.dst + op.done, want, got)) {
          if (peer.closed) tcp_closed(peer, p);
          return;
        }
        op.done += got;
        peer.rx_left -= got;
      } else {
        if (!need_more()) return;
        continue;
      }
      if (peer.rx_left == 0) peer.rx_type = 0;
      if (op.done == op.bytes && peer.rx_type == 0) {
        complete(peer, false);
        if (peer.recvq.empty()) return;
      }
    }
  }

  void tcp_closed(Peer& peer, int p) {
    if (!peer.recvq.empty()) peer_died(p, ops_[peer.recvq.front()]);
    if (!peer.sendq.empty()) peer_died(p, ops_[peer.sendq.front()]);
  }

  void tcp_send_abort(Peer& peer, ErrorKind kind, int origin, const std::string& reason) {
    // Finish a frame in flight (bounded), so the ABORT lands on a frame boundary.
    const Deadline dl = Deadline::after(0.5);
    try {
      if (!peer.sendq.empty() && (peer.tx_hdr_off < peer.tx_hdr_len || peer.tx_frame_left > 0)) {
        detail::Op& op = ops_[peer.sendq.front()];
        net::send_all(peer.fd, peer.tx_hdr + peer.tx_hdr_off, peer.tx_hdr_len - peer.tx_hdr_off, dl,
                      "peer");
        peer.tx_hdr_off = peer.tx_hdr_len;
        net::send_all(peer.fd, op.src + op.done, peer.tx_frame_left, dl, "peer");
        peer.tx_frame_left = 0;
      }
      const std::string body = reason.substr(0, 4000);
      std::vector<unsigned char> frame(sizeof(detail::FrameHeader) + 8 + body.size());
      detail::FrameHeader h{detail::kFrameAbort, static_cast<std::uint32_t>(8 + body.size())};
      const auto k = static_cast<std::int32_t>(kind);
      std::memcpy(frame.data(), &h, sizeof(h));
      std::memcpy(frame.data() + 8, &k, 4);
      std::memcpy(frame.data() + 12, &origin, 4);
      std::memcpy(frame.data() + 16, body.data(), body.size());
      net::send_all(peer.fd, frame.data(), frame.size(), dl, "peer");
      ::shutdown(peer.fd, SHUT_WR);
    } catch (const Error&) {
      ::shutdown(peer.fd, SHUT_RDWR);  // could not say why; at least say that we are gone
    }
  }

  // ---------------- blocking ----------------

  void block(const Deadline& dl) {
    if (aborted_) rethrow();
    const std::uint64_t before = completions_;
    progress();
    if (completions_ != before || pending_ == 0) return;
    // Spin: cheap polling of shared-memory flags while the peer is likely running right now.
    const auto spin_until =
        Clock::now() + std::chrono::nanoseconds(static_cast<long long>(spin_us_ * 1000));
    // One pause per check: on current x86 a pause is ~140 cycles, so a longer pause burst is
    // pure added latency once the peer's store lands.
    int iter = 0;
    while (Clock::now() < spin_until) {
      detail::cpu_relax();
      progress();
      if (completions_ != before) return;
      if (++iter % 1024 == 0) ::sched_yield();
    }
    std::vector<pollfd> fds;
    for (;;) {
      if (dl.expired()) {
        try {
          throw TimeoutError(timeout_message());
        } catch (const Error& e) {
          fail(e);
        }
      }
      if (ctrl_) ctrl_->sleeping.store(1, std::memory_order_seq_cst);
      progress();
      if (completions_ != before) {
        if (ctrl_) ctrl_->sleeping.store(0, std::memory_order_relaxed);
        return;
      }
      fds.clear();
      if (bell_fd_ >= 0) fds.push_back({bell_fd_, POLLIN, 0});
      for (auto& peer : peers_) {
        if (peer.route == Route::shm && peer.pidfd >= 0 && !peer.dead) {
          fds.push_back({peer.pidfd, POLLIN, 0});
        } else if (peer.route == Route::tcp && peer.fd >= 0 && !peer.closed) {
          short ev = 0;
          if (!peer.recvq.empty() || !peer.data_waiting) ev |= POLLIN;
          if (peer.want_out) ev |= POLLOUT;
          if (ev) fds.push_back({peer.fd, ev, 0});
        }
      }
      const int rc = ::poll(fds.data(), fds.size(), dl.remaining_ms(200));
      if (ctrl_) ctrl_->sleeping.store(0, std::memory_order_relaxed);
      if (rc < 0 && errno != EINTR) throw Error("poll failed: " + net::errno_text(errno));
      if (bell_fd_ >= 0) {
        char buf[256];
        while (::read(bell_fd_, buf, sizeof(buf)) > 0) {
        }
      }
      for (const auto& f : fds) {
        if (!(f.revents & POLLIN)) continue;
        for (auto& peer : peers_) {
          if (peer.pidfd == f.fd && !peer.dead) peer.dead = true;  // re-checked against slots
        }
      }
      progress();
      if (completions_ != before) return;
    }
  }

  std::string timeout_message() const {
    std::string waiting;
    std::string what;
    for (int p = 0; p < size_; ++p) {
      const auto& peer = peers_[static_cast<std::size_t>(p)];
      if (peer.sendq.empty() && peer.recvq.empty()) continue;
      if (what.empty()) {
        const auto& op = ops_[peer.recvq.empty() ? peer.sendq.front() : peer.recvq.front()];
        what = op.sig.describe();
      }
      waiting += (waiting.empty() ? "" : ", ") + peer_desc(p);
    }
    char to[32];
    std::snprintf(to, sizeof(to), "%g", timeout_);
    return "rank " + std::to_string(rank_) + " timed out in " + (what.empty() ? "a wait" : what) +
           " after " + to + " s waiting for " + (waiting.empty() ? "nothing" : waiting) +
           " (raise KOLO_TIMEOUT_SECONDS if the job is just slow)";
  }

  int rank_;
  int size_;
  RouteMode mode_;
  MeshOptions opts_;
  double timeout_;
  std::vector<std::string> host_keys_;  // every rank's, for route_between
  double spin_us_ = 0;
  std::vector<Peer> peers_;
  std::deque<detail::Op> ops_;
  std::vector<std::uint32_t> free_;
  std::size_t pending_ = 0;
  std::uint64_t completions_ = 0;
  std::uint64_t seen_completions_ = 0;
  // shm
  std::vector<int> local_ranks_;
  std::vector<int> local_index_;
  std::shared_ptr<detail::ShmMapping> own_;
  detail::ShmControl* ctrl_ = nullptr;
  int bell_fd_ = -1;
  // tcp
  std::atomic<bool> stop_accepting_{false};
  // errors
  bool aborted_ = false;
  ErrorKind error_kind_ = ErrorKind::generic;
  std::string error_what_;
  int abort_origin_ = -1;
};

static_assert(check_transport<MeshTransport>());

}  // namespace kolo
