// The mesh's shared-memory channel (transport/mesh/shm_channel.hpp), in one process: two ranks'
// segments and a channel each way between them, driven by hand (push, pull). Checked: the
// messages arrive with their bytes, and the first small message through every slot of a fresh
// channel takes no page fault (the slots' first pages are mapped when the channel is set up).
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kolo/core/signature.hpp"
#include "kolo/transport/mesh/shm_channel.hpp"

namespace {

// Under a sanitizer, touching memory also touches its shadow, which takes faults of its own:
// the count is checked in the plain builds only (the values in every build).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kShadowMemory = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kShadowMemory = true;
#else
constexpr bool kShadowMemory = false;
#endif
#else
constexpr bool kShadowMemory = false;
#endif

using kolo::detail::ShmChannel;
using kolo::detail::ShmGeometry;
using kolo::detail::ShmSegment;
using kolo::detail::StreamOp;

long minor_faults() {
  rusage u{};
  ::getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt;
}

// Rank 0 and rank 1 of a job on this host, both in this process.
struct Pair {
  std::string token;
  ShmGeometry g;
  ShmSegment seg[2];
  ShmChannel ch[2];  // ch[r]: rank r's channel to the other rank

  Pair(const std::string& name, ShmGeometry geometry) : g(geometry) {
    token = name + "-" + std::to_string(::getpid());
    for (int r = 0; r < 2; ++r) seg[r].create(token, r, 2, g);
    for (int r = 0; r < 2; ++r) {
      ch[r].open(token, 1 - r, static_cast<int>(::getpid()), 2, static_cast<std::size_t>(r),
                 static_cast<std::size_t>(1 - r), seg[r], g);
    }
    for (int r = 0; r < 2; ++r) ShmSegment::unlink_names(token, r);
  }

  // One message from rank `from` to the other, received into `got` (its size: the message's).
  void send(int from, const std::vector<std::byte>& data, std::vector<std::byte>& got) {
    kolo::Signature sig{};
    StreamOp s;
    s.kind = kolo::detail::OpKind::send;
    s.peer = 1 - from;
    s.src = data.data();
    s.bytes = data.size();
    s.sig = sig;
    StreamOp r;
    r.kind = kolo::detail::OpKind::recv;
    r.peer = from;
    r.dst = got.data();
    r.bytes = got.size();
    r.sig = sig;
    bool published = false, freed = false;
    REQUIRE(ch[from].push(s, published));
    REQUIRE(ch[1 - from].pull(r, freed, 1 - from));
    CHECK(published);
    CHECK(freed);
  }
};

}  // namespace

TEST_CASE("shm channel: the first small message through every slot takes no page fault") {
  ShmGeometry g;  // the defaults: 8 slots of 256 KiB
  // A first pair runs the code paths once (their own first-use faults are not the point).
  Pair warm("kolo-unit-warm", g);
  std::vector<std::byte> msg(2048);
  for (std::size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<std::byte>(i * 7 + 1);
  // Receive buffers made up front: the measured loop allocates nothing.
  std::vector<std::vector<std::byte>> got(2 * g.slots,
                                          std::vector<std::byte>(msg.size(), std::byte{0xee}));
  for (std::size_t k = 0; k < 2 * g.slots; ++k) warm.send(static_cast<int>(k % 2), msg, got[k]);
  for (const auto& v : got) CHECK(v == msg);
  for (auto& v : got) std::fill(v.begin(), v.end(), std::byte{0xee});

  Pair fresh("kolo-unit-fresh", g);
  long faults = 0;
  for (std::size_t k = 0; k < 2 * g.slots; ++k) {  // each direction: every slot once
    const long before = minor_faults();
    fresh.send(static_cast<int>(k % 2), msg, got[k]);
    faults += minor_faults() - before;
  }
  for (const auto& v : got) CHECK(v == msg);
  // Without the prefault each slot's first page faulted once in the sender (allocate) and once
  // in the receiver (map): 32 here. (The checks above run outside the counted spans.)
  if (kShadowMemory) {
    MESSAGE("sanitizer build: " << faults << " minor faults (the count is not checked)");
  } else {
    CHECK_MESSAGE(faults <= 2, "minor faults over the first " << 2 * g.slots << " messages");
  }
}

TEST_CASE("shm channel: the abort record keeps the earliest call's error") {
  Pair p("kolo-test-abort-record", ShmGeometry{2, 4096});
  CHECK(!p.seg[1].abort_posted());
  // Rank 0 tells rank 1 of an error of call 7, then of call 9: the record keeps call 7's.
  p.ch[0].post_abort(kolo::ErrorKind::config, 0, "call seven", 7);
  REQUIRE(p.seg[1].abort_posted());
  const std::uint32_t first = p.seg[1].abort_serial();
  p.ch[0].post_abort(kolo::ErrorKind::mismatch, 0, "call nine", 9);
  CHECK(p.seg[1].abort_serial() == first);
  auto a = p.seg[1].abort_record();
  REQUIRE(a);
  CHECK(a->seq == 7);
  CHECK(a->reason == "call seven");
  CHECK(a->kind == kolo::ErrorKind::config);
  // An error of an earlier call replaces it (and the serial says the record changed); the same
  // call again does not.
  p.ch[0].post_abort(kolo::ErrorKind::timeout, 2, "call three", 3);
  CHECK(p.seg[1].abort_serial() != first);
  a = p.seg[1].abort_record();
  REQUIRE(a);
  CHECK(a->seq == 3);
  CHECK(a->origin == 2);
  CHECK(a->reason == "call three");
  p.ch[0].post_abort(kolo::ErrorKind::config, 1, "call three again", 3);
  a = p.seg[1].abort_record();
  REQUIRE(a);
  CHECK(a->reason == "call three");
  // 0 ("no call in particular") is the earliest of all.
  p.ch[0].post_abort(kolo::ErrorKind::peer_lost, 0, "now", 0);
  a = p.seg[1].abort_record();
  REQUIRE(a);
  CHECK(a->seq == 0);
  CHECK(a->reason == "now");
}
