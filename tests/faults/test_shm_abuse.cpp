// A local peer that writes nonsense into the shared memory it shares with this rank: slot
// headers whose length exceeds the slot or the posted receive, or splits an element of a
// reduction; a segment of another size than this rank's geometry; an abort record with an
// unknown kind and no terminating NUL. Each must be a clear error naming the peer (or bounded
// data), never an overread, an overwrite or a hang.
//
// Both ranks live in this process: two real segments and doorbells in /dev/shm (a random token,
// unlinked at once), rank 0's channel writes, rank 1's channel reads, and the test rewrites the
// header in between, as a hostile or corrupt peer would.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/transport/mesh/shm_channel.hpp"

namespace {

using kolo::detail::OpKind;
using kolo::detail::ShmChannel;
using kolo::detail::ShmGeometry;
using kolo::detail::ShmSegment;
using kolo::detail::ShmSlotHeader;
using kolo::detail::StreamOp;

std::string random_token() {
  std::random_device rd;
  return "h1t" + std::to_string(::getpid()) + "x" + std::to_string(rd() % 100000);
}

// Ranks 0 and 1 of one host, both here: c01 is rank 0's channel to rank 1, c10 rank 1's to 0.
struct Pair {
  ShmGeometry g{4, 4096};
  std::string token = random_token();
  ShmSegment seg0, seg1;
  ShmChannel c01, c10;

  Pair() {
    seg0.create(token, 0, 2, g, 0);
    seg1.create(token, 1, 2, g, 1);
    c01.open(token, 1, ::getpid(), 2, 0, 1, seg0, g);
    c10.open(token, 0, ::getpid(), 2, 1, 0, seg1, g);
    ShmSegment::unlink_names(token, 0);
    ShmSegment::unlink_names(token, 1);
  }
  // The slot rank 0 wrote first, inside rank 1's segment.
  ShmSlotHeader* first_slot() const {
    return reinterpret_cast<ShmSlotHeader*>(seg1.inbound_ring(0));
  }
};

StreamOp op(OpKind kind, int peer, std::size_t bytes, const std::byte* src, std::byte* dst) {
  StreamOp o;
  o.kind = kind;
  o.peer = peer;
  o.bytes = bytes;
  o.src = src;
  o.dst = dst;
  o.sig.seq = 7;
  return o;
}

void add_floats(void* dst, const void* a, const void* b, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    static_cast<float*>(dst)[i] = static_cast<const float*>(a)[i] + static_cast<const float*>(b)[i];
  }
}

// Rank 0 sends `bytes`; the test sets the first slot's length to `lie`; rank 1's receive of
// `bytes` (into a buffer with a guard after it) must fail naming rank 0, the guard untouched.
void expect_bad_length(std::size_t bytes, std::uint64_t lie, OpKind kind) {
  Pair p;
  std::vector<std::byte> src(bytes, std::byte{1});
  StreamOp send = op(OpKind::send, 1, bytes, src.data(), nullptr);
  bool published = false;
  (void)p.c01.push(send, published);
  REQUIRE(published);
  p.first_slot()->bytes = lie;

  std::vector<std::byte> dst(bytes + 4096, std::byte{0x5a});
  std::vector<std::byte> local(bytes, std::byte{0});
  StreamOp recv = op(kind, 0, bytes, local.data(), dst.data());
  recv.rs.fn = add_floats;
  recv.rs.elem_size = sizeof(float);
  bool freed = false;
  std::string what;
  try {
    (void)p.c10.pull(recv, freed, 1);
  } catch (const kolo::Error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.find("protocol error from rank 0") != std::string::npos);
  CHECK(what.find(std::to_string(lie)) != std::string::npos);
  for (std::size_t i = bytes; i < dst.size(); ++i) REQUIRE(dst[i] == std::byte{0x5a});
}

}  // namespace

TEST_CASE("shm/bad_length/larger_than_slot") {
  // 8000 bytes posted, the slot holds 4096: a length of 8000 would read past the slot.
  expect_bad_length(8000, 8000, OpKind::recv);
}

TEST_CASE("shm/bad_length/larger_than_receive") {
  // 1000 bytes posted and sent: a length of 4096 fits the slot but not the receive.
  expect_bad_length(1000, 4096, OpKind::recv);
}

TEST_CASE("shm/bad_length/huge") {
  expect_bad_length(1000, std::uint64_t{1} << 62, OpKind::recv);
}

TEST_CASE("shm/bad_length/splits_an_element") {
  // A reduction of floats: 1001 bytes would leave a quarter of an element.
  expect_bad_length(2000, 1001, OpKind::recv_reduce);
}

TEST_CASE("shm/good_message_still_arrives") {
  Pair p;
  std::vector<float> src(3000), local(3000, 1.0f), dst(3000, 0.0f);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<float>(i);
  const std::size_t bytes = src.size() * sizeof(float);
  StreamOp send =
      op(OpKind::send, 1, bytes, reinterpret_cast<const std::byte*>(src.data()), nullptr);
  StreamOp recv =
      op(OpKind::recv_reduce, 0, bytes, reinterpret_cast<const std::byte*>(local.data()),
         reinterpret_cast<std::byte*>(dst.data()));
  recv.rs.fn = add_floats;
  recv.rs.elem_size = sizeof(float);
  bool flag = false, sent = false, got = false;
  for (int i = 0; i < 100 && !(sent && got); ++i) {
    sent = sent || p.c01.push(send, flag);
    got = got || p.c10.pull(recv, flag, 1);
  }
  REQUIRE(sent);
  REQUIRE(got);
  for (std::size_t i = 0; i < dst.size(); ++i) REQUIRE(dst[i] == src[i] + 1.0f);
}

TEST_CASE("shm/segment_of_another_size") {
  // Rank 1 believes in 8 slots where rank 0's segment has 4: a ConfigError naming both sizes
  // and the variables, not a mapping past the end of the file (SIGBUS at first touch).
  const std::string token = random_token();
  ShmSegment seg0, seg1;
  seg0.create(token, 0, 2, ShmGeometry{4, 4096}, 0);
  seg1.create(token, 1, 2, ShmGeometry{8, 4096}, 1);
  ShmChannel c10;
  std::string what;
  bool config = false;
  try {
    c10.open(token, 0, ::getpid(), 2, 1, 0, seg1, ShmGeometry{8, 4096});
  } catch (const kolo::Error& e) {
    what = e.what();
    config = e.kind() == kolo::ErrorKind::config;
  }
  ShmSegment::unlink_names(token, 0);
  ShmSegment::unlink_names(token, 1);
  INFO(what);
  CHECK(config);
  CHECK(what.find("rank 0's shared-memory segment") != std::string::npos);
  CHECK(what.find(std::to_string(ShmGeometry{4, 4096}.segment_bytes(2))) != std::string::npos);
  CHECK(what.find(std::to_string(ShmGeometry{8, 4096}.segment_bytes(2))) != std::string::npos);
  CHECK(what.find("KOLO_SHM_SLOT_BYTES") != std::string::npos);
}

TEST_CASE("shm/abort_record_is_bounded") {
  Pair p;
  // Through the API: a reason longer than the record is cut.
  p.c01.post_abort(kolo::ErrorKind::mismatch, 0, std::string(10000, 'x'), 3);
  auto a = p.seg1.abort_record();
  REQUIRE(a);
  CHECK(a->kind == kolo::ErrorKind::mismatch);
  CHECK(a->reason.size() < sizeof(kolo::detail::ShmControl::reason));
  // Written by hand, as a corrupt peer would: no NUL anywhere, a kind outside the enum.
  auto* ctrl = reinterpret_cast<kolo::detail::ShmControl*>(p.seg1.inbound_ring(0) -
                                                           kolo::detail::kShmControlBytes);
  std::memset(ctrl->reason, 'y', sizeof(ctrl->reason));
  ctrl->abort_kind = 12345;
  a = p.seg1.abort_record();
  REQUIRE(a);
  CHECK(a->kind == kolo::ErrorKind::generic);
  CHECK(a->reason.size() == sizeof(ctrl->reason));
}
