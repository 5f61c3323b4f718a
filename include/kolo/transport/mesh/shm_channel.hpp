// kolo/transport/mesh/shm_channel.hpp — the mesh's shared-memory route: segment layout, mapping,
// and the single-producer single-consumer slot ring that carries messages between two ranks of
// one host.
//
// Every rank owns one POSIX shared-memory segment (ShmSegment): a control block (the sleeping
// flag of its doorbell, an abort record peers write into) and one inbound ring per local peer.
// A ring is K slots of S bytes, each behind a 64-byte header whose `full` flag is the only
// synchronising field: the producer fills a free slot and publishes it with a release store, the
// consumer copies or reduces straight out of it (irecv_reduce needs no temporary) and frees it
// with a release store. The first slot of a message carries the sender's Signature and the
// message's size, checked against the receive before any byte is delivered.
//
// ShmChannel is one peer as seen from this rank: the ring it writes (inside the peer's segment),
// the ring it reads (inside its own), the peer's doorbell and its pidfd, through which a
// SIGKILLed peer is noticed at once. It moves bytes and nothing else: which operation comes
// next, completion and errors are the engine's (mesh.hpp); how a sleeping peer is woken is the
// doorbell's (doorbell.hpp). A zero-copy path (the receiver reading the sender's buffer through
// cross-memory attach, say) belongs here, behind push/pull.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/transport/mesh/doorbell.hpp"
#include "kolo/transport/op_pool.hpp"

namespace kolo::detail {

// ---- layout ----

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
  std::atomic<std::int32_t> cpu;        // the CPU the owner last spun on; -1 not known
  std::uint32_t pad0[14];
  // The abort record peers write (post_abort): 0 none, 1 being written, 2 ready to read. A
  // ready record is replaced only by one of an earlier call (a lower abort_seq), so the record
  // holds the first failure in call order; abort_serial counts the writes, so that a reader sees
  // a replaced record as new and can tell a read torn by a concurrent writer.
  std::atomic<std::uint32_t> aborted;
  std::int32_t abort_kind;
  std::int32_t abort_origin;
  std::int32_t pid;
  std::atomic<std::uint32_t> abort_serial;
  std::uint32_t pad1;
  std::uint64_t abort_seq;  // RemoteAbort::seq (0: at once)
  char reason[2048];
};

inline constexpr std::size_t kShmControlBytes = 4096;
static_assert(sizeof(ShmControl) <= kShmControlBytes);

// Ring geometry, the same on every rank of a job (KOLO_SHM_SLOTS, KOLO_SHM_SLOT_BYTES).
struct ShmGeometry {
  std::size_t slots = 8;
  std::size_t slot_bytes = 256 * 1024;

  std::size_t stride() const { return sizeof(ShmSlotHeader) + slot_bytes; }
  std::size_t ring_bytes() const { return slots * stride(); }
  // A segment with one inbound ring per local rank (its own included: indices stay simple).
  std::size_t segment_bytes(std::size_t local_ranks) const {
    return kShmControlBytes + local_ranks * ring_bytes();
  }
  // What such a segment holds in memory: its own ring carries nothing, so it is not reserved.
  std::size_t reserved_bytes(std::size_t local_ranks) const {
    return kShmControlBytes + (local_ranks > 0 ? local_ranks - 1 : 0) * ring_bytes();
  }
};

inline std::string shm_segment_name(const std::string& token, int rank) {
  return "/kolo-" + token + "-" + std::to_string(rank);
}

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

// The bytes free in the file system that holds the POSIX shared-memory names (-1: unknown).
inline long long shm_free_bytes() {
  struct statvfs v {};
  if (::statvfs("/dev/shm", &v) != 0) return -1;
  return static_cast<long long>(v.f_bavail) * static_cast<long long>(v.f_frsize);
}

// The size of that file system (-1: unknown).
inline long long shm_total_bytes() {
  struct statvfs v {};
  if (::statvfs("/dev/shm", &v) != 0) return -1;
  return static_cast<long long>(v.f_blocks) * static_cast<long long>(v.f_frsize);
}

// The geometry this host's `local_ranks` ranks use. Explicitly chosen values are kept; the
// defaults (8 slots of 256 KiB: local_ranks^2 rings of 2 MiB on the host, 128 MiB for 8 ranks)
// halve their slot size, down to 16 KiB, until every segment of the host fits in 3/4 of
// /dev/shm's size (8 ranks in a 64 MiB container /dev/shm: 64 KiB slots, 33 MiB). Every rank
// of the host computes the same result: the same inputs, the same file system.
inline ShmGeometry fit_shm_geometry(ShmGeometry g, std::size_t local_ranks) {
  const ShmGeometry defaults;
  if (g.slots != defaults.slots || g.slot_bytes != defaults.slot_bytes || local_ranks < 2) {
    return g;
  }
  const long long total = shm_total_bytes();
  if (total <= 0) return g;
  const auto budget = static_cast<std::size_t>(total) / 4 * 3;
  while (g.slot_bytes > 16 * 1024 && local_ranks * g.reserved_bytes(local_ranks) > budget) {
    g.slot_bytes /= 2;
  }
  return g;
}

// Maps segment `name` of `bytes`: created (sized and its pages reserved, so that a /dev/shm too
// small fails here, not with a SIGBUS at some later first touch) or opened (a segment of any
// other size is a ConfigError: a peer with another geometry). `whose` names it in errors
// ("rank 3's shared-memory segment").
inline std::shared_ptr<ShmMapping> map_shm_segment(const std::string& name, std::size_t bytes,
                                                   bool create,
                                                   const std::string& whose = "shared memory",
                                                   std::size_t hole_at = 0,
                                                   std::size_t hole_bytes = 0) {
  const int fd = ::shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
  if (fd < 0) {
    throw Error("shm_open(" + name + ") failed: " + net::errno_text(errno) +
                (create ? " (is /dev/shm mounted and writable?)" : ""));
  }
  const auto fail = [&](const std::string& why, bool config) {
    ::close(fd);
    if (create) ::shm_unlink(name.c_str());
    if (config) throw ConfigError(why);
    throw Error(why);
  };
  if (create) {
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      fail("cannot size " + whose + " (" + name + ") to " + std::to_string(bytes) +
               " bytes: " + net::errno_text(errno) + " (is /dev/shm large enough?)",
           false);
    }
    // Every byte but the hole [hole_at, hole_at + hole_bytes): reserved now.
    const auto reserve = [fd](std::size_t from, std::size_t to) {
      int r = 0;
      if (to <= from) return r;
      do {
        r = ::posix_fallocate(fd, static_cast<off_t>(from), static_cast<off_t>(to - from));
      } while (r == EINTR);
      return r;
    };
    int rc = reserve(0, hole_at);
    if (rc == 0) rc = reserve(hole_at + hole_bytes, bytes);
    // EOPNOTSUPP/EINVAL: a file system without fallocate; the pages then come on first touch.
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL) {
      const long long free_bytes = shm_free_bytes();
      fail(whose + " needs " + std::to_string(bytes - hole_bytes) + " bytes, but /dev/shm has " +
               (free_bytes < 0 ? std::string("an unknown number of") : std::to_string(free_bytes)) +
               " bytes free (" + net::errno_text(rc) +
               "): enlarge /dev/shm (docker run --shm-size), lower KOLO_SHM_SLOTS or "
               "KOLO_SHM_SLOT_BYTES, or use KOLO_TRANSPORT=tcp",
           rc == ENOSPC);
    }
  } else {
    struct stat st {};
    if (::fstat(fd, &st) != 0)
      fail("fstat of " + name + " failed: " + net::errno_text(errno), false);
    if (static_cast<std::size_t>(st.st_size) != bytes) {
      fail(whose + " (" + name + ") is " + std::to_string(st.st_size) +
               " bytes, this rank expects " + std::to_string(bytes) +
               ": the ranks of this host disagree on KOLO_SHM_SLOTS or KOLO_SHM_SLOT_BYTES",
           true);
    }
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    throw Error("mmap of " + name + " failed: " + net::errno_text(err));
  }
  auto m = std::make_shared<ShmMapping>();
  m->base = p;
  m->bytes = bytes;
  return m;
}

// Maps the first pages of every slot of `ring` into this process before a message does: the
// page of each slot's header and the page after it, which carry a message of up to about 4 KiB.
// A shared-memory page is allocated on its first touch and mapped into each process on its own
// first touch, each a page fault of a few microseconds; a small message walks the ring's slots
// one by one, so the first `slots` messages of every channel paid them. On a fresh job of 8
// ranks that was 100+ faults per rank in its first small collectives. Larger messages still
// fault their further pages in once. MADV_POPULATE_WRITE (Linux 5.14) allocates and maps
// without writing, so it is safe while a peer uses the ring; on an older kernel a read of each
// page maps it.
inline void prefault_slot_heads(std::byte* ring, const ShmGeometry& g) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (std::size_t i = 0; i < g.slots; ++i) {
    const auto at = reinterpret_cast<std::uintptr_t>(ring + i * g.stride());
    const std::uintptr_t lo = at / page * page;
    const std::uintptr_t hi =
        std::min(lo + 2 * page, reinterpret_cast<std::uintptr_t>(ring) + g.ring_bytes());
#ifdef MADV_POPULATE_WRITE
    if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE) == 0) continue;
    // Anything but an unknown advice (a full /dev/shm, say): leave the pages to the first
    // message, as without the prefault, rather than touch them here.
    if (errno != EINVAL) return;
#endif
    for (std::uintptr_t q = lo; q < hi; q += page) {
      (void)*reinterpret_cast<const volatile std::byte*>(std::max(q, at));
    }
  }
}

// This rank's own segment: its control block, its doorbell and its inbound rings.
class ShmSegment {
 public:
  // Creates and maps the segment (`local_ranks` inbound rings) and the doorbell, by name. This
  // rank is local index `self`: its own ring is never written, so it is not reserved (without
  // `self`, all of it is).
  void create(const std::string& token, int rank, std::size_t local_ranks, ShmGeometry g,
              std::size_t self = ~std::size_t{0}) {
    const bool hole = self < local_ranks;
    geometry_ = g;
    const std::string what =
        "rank " + std::to_string(rank) + "'s shared-memory segment (" +
        std::to_string(local_ranks - 1) + (local_ranks == 2 ? " ring of " : " rings of ") +
        std::to_string(g.slots) + " slots of " + std::to_string(g.slot_bytes) +
        " bytes; the host's " + std::to_string(local_ranks) + " ranks need " +
        std::to_string(local_ranks * g.reserved_bytes(local_ranks)) + " bytes in all)";
    mapping_ = map_shm_segment(shm_segment_name(token, rank), g.segment_bytes(local_ranks), true,
                               what, hole ? kShmControlBytes + self * g.ring_bytes() : 0,
                               hole ? g.ring_bytes() : 0);
    ctrl_ = new (mapping_->base) ShmControl();
    ctrl_->pid = static_cast<std::int32_t>(::getpid());
    ctrl_->cpu.store(-1, std::memory_order_relaxed);
    for (std::size_t k = 0; k < local_ranks; ++k) {
      if (k != self) prefault_slot_heads(inbound_ring(k), g);
    }
    bell_.create(doorbell_path(token, rank), &ctrl_->sleeping);
  }

  // Once every local rank has mapped and opened everything: a crash can then leak nothing.
  static void unlink_names(const std::string& token, int rank) {
    ::shm_unlink(shm_segment_name(token, rank).c_str());
    ::unlink(doorbell_path(token, rank).c_str());
  }

  bool valid() const { return ctrl_ != nullptr; }
  Doorbell& doorbell() { return bell_; }
  // Where this rank spins now, for the local peers' wait policy (mesh/poll_loop.hpp): a hint.
  // Written only when it changes: the line is the one producers read `sleeping` from.
  void note_cpu(int cpu) {
    if (ctrl_->cpu.load(std::memory_order_relaxed) != cpu) {
      ctrl_->cpu.store(cpu, std::memory_order_relaxed);
    }
  }
  // The inbound ring of the local rank with index `local_index`.
  std::byte* inbound_ring(std::size_t local_index) const {
    return static_cast<std::byte*>(mapping_->base) + kShmControlBytes +
           local_index * geometry_.ring_bytes();
  }

  // A peer's abort, once it is completely written (cheap: one acquire load when there is none).
  bool abort_posted() const { return ctrl_ && ctrl_->aborted.load(std::memory_order_acquire) == 2; }
  // Which write of the record is there now (changes when a peer replaces it).
  std::uint32_t abort_serial() const { return ctrl_->abort_serial.load(std::memory_order_acquire); }
  // The record, if it could be read whole: nullopt when a peer is rewriting it right now (the
  // caller looks again on its next pass).
  std::optional<RemoteAbort> abort_record() const {
    const std::uint32_t serial = abort_serial();
    // Written by a peer: a kind outside the enum reads as a generic error; the text is bounded
    // by the record's size (strnlen), whatever the writer left in it.
    const std::int32_t kind = ctrl_->abort_kind;
    const bool known = kind >= static_cast<std::int32_t>(ErrorKind::generic) &&
                       kind <= static_cast<std::int32_t>(ErrorKind::revoked);
    RemoteAbort a{known ? static_cast<ErrorKind>(kind) : ErrorKind::generic, ctrl_->abort_origin,
                  std::string(ctrl_->reason, ::strnlen(ctrl_->reason, sizeof(ctrl_->reason))),
                  ctrl_->abort_seq};
    std::atomic_thread_fence(std::memory_order_acquire);
    if (ctrl_->aborted.load(std::memory_order_acquire) != 2 || abort_serial() != serial) {
      return std::nullopt;
    }
    return a;
  }

 private:
  ShmGeometry geometry_;
  std::shared_ptr<ShmMapping> mapping_;
  ShmControl* ctrl_ = nullptr;
  Doorbell bell_;
};

// One local peer: the ring this rank writes (in the peer's segment) and the one it reads (in its
// own), the peer's doorbell and its process handle.
class ShmChannel {
 public:
  ShmChannel() = default;
  ShmChannel(const ShmChannel&) = delete;
  ShmChannel& operator=(const ShmChannel&) = delete;
  ShmChannel(ShmChannel&& o) noexcept { *this = std::move(o); }
  ShmChannel& operator=(ShmChannel&& o) noexcept {
    std::swap(out_, o.out_);
    std::swap(in_, o.in_);
    std::swap(head_, o.head_);
    std::swap(tail_, o.tail_);
    std::swap(geometry_, o.geometry_);
    std::swap(peer_ctrl_, o.peer_ctrl_);
    std::swap(mapping_, o.mapping_);
    std::swap(bell_, o.bell_);
    std::swap(pidfd_, o.pidfd_);
    std::swap(dead_, o.dead_);
    return *this;
  }
  ~ShmChannel() {
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  // Maps peer `rank`'s segment (`local_ranks` rings) and opens its doorbell. This rank is local
  // index `me` (its ring in the peer's segment), the peer is `them` (its ring in `own`).
  void open(const std::string& token, int rank, int pid, std::size_t local_ranks, std::size_t me,
            std::size_t them, const ShmSegment& own, ShmGeometry g) {
    geometry_ = g;
    mapping_ = map_shm_segment(shm_segment_name(token, rank), g.segment_bytes(local_ranks), false,
                               "rank " + std::to_string(rank) + "'s shared-memory segment");
    auto* base = static_cast<std::byte*>(mapping_->base);
    peer_ctrl_ = reinterpret_cast<ShmControl*>(base);
    out_ = base + kShmControlBytes + me * g.ring_bytes();
    in_ = own.inbound_ring(them);
    (void)peer_ctrl_->sleeping.load(std::memory_order_relaxed);  // read at every send: map it now
    prefault_slot_heads(out_, g);
    bell_.open(doorbell_path(token, rank), rank, &peer_ctrl_->sleeping);
#ifdef SYS_pidfd_open
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
    (void)pid;
#endif
  }

  // Copies as much of send `op` into free slots as there are; true once all of it (and its first
  // slot, for an empty message) is published. `published`: a slot was.
  [[gnu::always_inline]] bool push(StreamOp& op, bool& published) {
    while (op.done < op.bytes || !op.begun) {
      ShmSlotHeader* s = slot(out_, head_);
      if (s->full.load(std::memory_order_acquire) != 0) return false;  // ring full: wait
      const std::size_t n = std::min(geometry_.slot_bytes, op.bytes - op.done);
      // n == 0 (an empty message) may come with a null src: memcpy must not see it (UB).
      auto* to = reinterpret_cast<std::byte*>(s + 1);
      if (op.pieces == nullptr) {
        if (n > 0) std::memcpy(to, op.src + op.done, n);
        op.done += n;
      } else {
        op.consume(n, [&to](std::byte*, const std::byte* src, std::size_t k) {
          std::memcpy(to, src, k);
          to += k;
        });
      }
      s->bytes = n;
      s->first = op.begun ? 0 : 1;
      if (!op.begun) {
        s->msg_bytes = op.bytes;
        s->sig = op.sig;
        op.begun = true;
      }
      s->full.store(1, std::memory_order_release);
      ++head_;
      published = true;
    }
    return true;
  }

  // Delivers (copies, or folds with op.rs) what the ring holds of receive `op`; true once all of
  // it has arrived, false when the ring is empty. `freed`: a slot was. The first slot is checked
  // against op: a different Signature or size is a MismatchError naming both calls.
  [[gnu::always_inline]] bool pull(StreamOp& op, bool& freed, int self) {
    while (op.done < op.bytes || !op.begun) {
      ShmSlotHeader* s = slot(in_, tail_);
      if (s->full.load(std::memory_order_acquire) == 0) return false;
      if (!op.begun) {
        if (!s->first || s->sig != op.sig || s->msg_bytes != op.bytes) {
          if (!s->first) {
            throw Error("shared-memory protocol error from rank " + std::to_string(op.peer) +
                        " (shm)");
          }
          throw_mismatch(op.peer, self, s->sig, s->msg_bytes, op);
        }
        op.begun = true;
      }
      // The peer wrote n: never trusted past the slot or the posted receive (a corrupt or
      // hostile header would read past the slot, or write past the receive buffer).
      const std::uint64_t n = s->bytes;
      if (n > std::min<std::uint64_t>(geometry_.slot_bytes, op.bytes - op.done)) [[unlikely]] {
        throw_bad_length(op, n);
      }
      const auto* data = reinterpret_cast<const std::byte*>(s + 1);
      if (op.pieces != nullptr) {
        if (op.kind == OpKind::recv_reduce && n % op.rs.elem_size != 0) [[unlikely]] {
          throw_bad_length(op, n);
        }
        deliver_pieces(op, data, n);
      } else if (op.kind == OpKind::recv) {
        if (n > 0) std::memcpy(op.dst + op.done, data, n);  // dst may be null when n == 0
        op.done += n;
      } else {
        if (n % op.rs.elem_size != 0) [[unlikely]]
          throw_bad_length(op, n);
        op.rs.fn(op.dst + op.done, op.src + op.done, data, n / op.rs.elem_size);
        op.done += n;
      }
      s->full.store(0, std::memory_order_release);
      ++tail_;
      freed = true;
    }
    return true;
  }

  // Wakes the peer if it sleeps (always, with `force`).
  void ring(bool force = false) {
    bell_.ring(force);
  }

  // Writes err into the peer's abort record and rings. A record already there stays unless
  // this one belongs to an earlier call (seq lower; 0, "at once", is the lowest), so the peer
  // reads the first failure in call order whichever rank wrote first. A writer that died while
  // writing leaves the record "being written": after a bounded wait this one gives up on it.
  void post_abort(ErrorKind kind, int origin, const std::string& reason, std::uint64_t seq) {
    if (peer_ctrl_ == nullptr) return;
    for (int tries = 0; tries < 10000; ++tries) {
      std::uint32_t state = peer_ctrl_->aborted.load(std::memory_order_acquire);
      if (state == 1) {
        ::sched_yield();
        continue;
      }
      if (state == 2 && peer_ctrl_->abort_seq <= seq) break;  // an earlier (or the same) call's
      if (!peer_ctrl_->aborted.compare_exchange_strong(state, 1)) continue;
      peer_ctrl_->abort_kind = static_cast<std::int32_t>(kind);
      peer_ctrl_->abort_origin = origin;
      peer_ctrl_->abort_seq = seq;
      const std::size_t n = std::min(reason.size(), sizeof(peer_ctrl_->reason) - 1);
      std::memcpy(peer_ctrl_->reason, reason.data(), n);
      peer_ctrl_->reason[n] = '\0';
      peer_ctrl_->abort_serial.fetch_add(1, std::memory_order_release);
      peer_ctrl_->aborted.store(2, std::memory_order_release);
      break;
    }
    ring(true);
  }

  // The peer's process handle (readable once it has exited), -1 without pidfd_open.
  // The CPU the peer last spun on (-1: not known); a hint, read without ordering.
  int peer_cpu() const {
    return peer_ctrl_ ? peer_ctrl_->cpu.load(std::memory_order_relaxed) : -1;
  }

  int pidfd() const {
    return pidfd_;
  }
  // The peer has exited: operations it can no longer complete fail (the engine decides which:
  // data already published is still delivered).
  bool dead() const {
    return dead_;
  }
  void mark_dead() {
    dead_ = true;
  }

 private:
  // A slot header whose length does not fit: the slot, the receive's remaining bytes, or (a
  // reduction) a whole number of elements.
  [[gnu::noinline, noreturn]] void throw_bad_length(const StreamOp& op, std::uint64_t n) const {
    throw Error("shared-memory protocol error from rank " + std::to_string(op.peer) +
                ": a slot says it holds " + std::to_string(n) + " bytes, but a slot holds " +
                std::to_string(geometry_.slot_bytes) + " and the receive has " +
                std::to_string(op.bytes - op.done) + " of " + std::to_string(op.bytes) +
                " bytes left" +
                (op.kind == OpKind::recv_reduce
                     ? " (elements of " + std::to_string(op.rs.elem_size) + " bytes)"
                     : std::string()) +
                " (shm)");
  }

  // A slot's `n` bytes into a vectored receive's pieces (copied, or folded with op.rs).
  [[gnu::noinline]] static void deliver_pieces(StreamOp& op, const std::byte* data, std::size_t n) {
    const bool reduce = op.kind == OpKind::recv_reduce;
    op.consume(n, [&](std::byte* dst, const std::byte* local, std::size_t k) {
      if (reduce) {
        op.rs.fn(dst, local, data, k / op.rs.elem_size);
      } else {
        std::memcpy(dst, data, k);
      }
      data += k;
    });
  }

  ShmSlotHeader* slot(std::byte* ring, std::uint64_t i) const {
    return reinterpret_cast<ShmSlotHeader*>(ring + (i % geometry_.slots) * geometry_.stride());
  }

  std::byte* out_ = nullptr;  // my ring inside the peer's segment
  std::byte* in_ = nullptr;   // the peer's ring inside my segment
  std::uint64_t head_ = 0, tail_ = 0;
  ShmGeometry geometry_;
  ShmControl* peer_ctrl_ = nullptr;
  std::shared_ptr<ShmMapping> mapping_;
  PeerBell bell_;
  int pidfd_ = -1;
  bool dead_ = false;
};

}  // namespace kolo::detail
