// libFuzzer target: the shared-memory receive path (transport/mesh/shm_channel.hpp,
// ShmChannel::pull) reading slot headers a corrupt or hostile local peer wrote.
//
// Two real segments of one process (4 slots of 4 KiB, in /dev/shm, names unlinked at once) are
// made once; each input posts one receive on rank 1's channel and plays rank 0 by writing slot
// headers and payload straight into the ring, as a peer with its own ideas would, calling pull
// after each slot.
//
// Input: kind:u8 (0 recv, 1 recv_reduce of floats, 2 vectored recv in two pieces), size:u16
// (the receive's bytes; rounded to floats for a reduction), then records of
//   flags:u8 (bit 0: first, bit 1: the right signature, bit 2: msg_bytes = the receive's size,
//             else msg:u32 follows; bit 3: bytes = what is left, else len:u32 follows)
// Checks, beyond ASan/UBSan: pull never writes past the receive (a guard after it is intact),
// never counts more than the receive holds, and ends every input with a completed receive or a
// kolo::Error (never another exception); a failed channel is rebuilt before the next input.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/transport/mesh/shm_channel.hpp"

namespace {

using namespace kolo::detail;

const ShmGeometry kGeometry{4, 4096};

struct Pair {
  ShmSegment seg0, seg1;
  ShmChannel c10;  // rank 1 reads what "rank 0" writes into seg1's ring 0
  Pair() {
    const std::string token = "fz" + std::to_string(::getpid()) + "-" + std::to_string(serial++);
    seg0.create(token, 0, 2, kGeometry, 0);
    seg1.create(token, 1, 2, kGeometry, 1);
    c10.open(token, 0, ::getpid(), 2, 1, 0, seg1, kGeometry);
    ShmSegment::unlink_names(token, 0);
    ShmSegment::unlink_names(token, 1);
  }
  ShmSlotHeader* slot(std::uint64_t i) const {
    return reinterpret_cast<ShmSlotHeader*>(seg1.inbound_ring(0) +
                                            (i % kGeometry.slots) * kGeometry.stride());
  }
  static inline int serial = 0;
};

struct Reader {
  const std::uint8_t* p;
  std::size_t n;
  bool take(void* out, std::size_t k) {
    if (n < k) return false;
    std::memcpy(out, p, k);
    p += k;
    n -= k;
    return true;
  }
};

void add_floats(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    static_cast<float*>(dst)[i] = static_cast<const float*>(a)[i] + static_cast<const float*>(b)[i];
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static std::unique_ptr<Pair> pair;
  static std::uint64_t written = 0;  // slots written into the ring so far (the channel's tail)
  if (!pair) {
    pair = std::make_unique<Pair>();
    written = 0;
  }
  Reader in{data, size};
  std::uint8_t kind = 0;
  std::uint16_t want = 0;
  if (!in.take(&kind, 1) || !in.take(&want, 2)) return 0;
  kind %= 3;
  std::size_t bytes = want;
  if (kind == 1) bytes -= bytes % sizeof(float);

  constexpr std::size_t kGuard = 4096;
  std::vector<std::byte> dst(bytes + kGuard, std::byte{0x5a});
  std::vector<std::byte> local(bytes + 1, std::byte{0});
  kolo::IoPiece pieces[2] = {{dst.data(), local.data(), bytes / 2},
                             {dst.data() + bytes / 2, local.data() + bytes / 2, bytes - bytes / 2}};
  StreamOp op;
  op.kind = kind == 1 ? OpKind::recv_reduce : OpKind::recv;
  op.peer = 0;
  op.bytes = bytes;
  op.dst = dst.data();
  op.src = local.data();
  op.sig.seq = 11;
  op.rs.fn = add_floats;
  op.rs.elem_size = sizeof(float);
  if (kind == 2) {
    op.pieces = pieces;
    op.npieces = 2;
  }

  bool done = false, failed = false;
  for (int records = 0; records < 64 && !done && !failed; ++records) {
    std::uint8_t flags = 0;
    if (!in.take(&flags, 1)) break;
    std::uint32_t msg = static_cast<std::uint32_t>(bytes), len = 0;
    if (!(flags & 4) && !in.take(&msg, 4)) break;
    if (!(flags & 8) && !in.take(&len, 4)) break;
    ShmSlotHeader* s = pair->slot(written);
    if (s->full.load() != 0) break;  // a slot pull did not free: the ring is as pull left it
    s->first = flags & 1;
    s->msg_bytes = msg;
    s->sig = op.sig;
    if (!(flags & 2)) s->sig.seq = 12;
    s->bytes = (flags & 8) ? bytes - op.done : len;
    std::memset(s + 1, 0x11, kGeometry.slot_bytes);
    s->full.store(1);
    ++written;
    bool freed = false;
    try {
      done = pair->c10.pull(op, freed, 1);
    } catch (const kolo::Error&) {
      failed = true;
    }
    if (op.done > op.bytes) std::abort();
  }
  for (std::size_t i = bytes; i < dst.size(); ++i) {
    if (dst[i] != std::byte{0x5a}) std::abort();
  }
  // The next input starts on a clean ring: a failed or unfinished receive leaves slots behind.
  if (!done) pair.reset();
  return 0;
}
