// Tests of the rendezvous store's wire protocol on its own (topology/store/protocol.hpp): no
// sockets, no server. Every request and reply round-trips through its encoder and decoder, and
// truncated, oversized or garbage frames are refused with the text the server logs.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/topology/store/protocol.hpp"

namespace {

namespace sd = kolo::store_detail;

// The body (tag + payload) of the one frame in `frame`, checked to be whole.
std::string_view body_of(const std::string& frame) {
  const sd::FrameHead h = sd::peek_frame(frame);
  REQUIRE(h.state == sd::FrameState::complete);
  REQUIRE(frame.size() == 4 + std::size_t{h.len});
  return std::string_view(frame).substr(4, h.len);
}

const char* decode(const std::string& frame, sd::Request& q) {
  return sd::decode_request(body_of(frame), q);
}

}  // namespace

TEST_CASE("store protocol: every request round-trips through its encoder and decoder") {
  sd::Request q;
  const std::string binary_key("k\0\xff", 3);

  std::string f;
  sd::encode_set(f, binary_key, std::string("v\0v", 3));
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kSet);
  CHECK(q.key == binary_key);
  CHECK(q.value == std::string("v\0v", 3));

  f.clear();
  sd::encode_set(f, "empty", "");
  CHECK(decode(f, q) == nullptr);
  CHECK(q.value.empty());

  f.clear();
  sd::encode_get(f, 1234, "addr/3");
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kGet);
  CHECK(q.key == "addr/3");
  CHECK(q.wait_ms == 1234);

  f.clear();
  sd::encode_add(f, "barrier", -7);
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kAdd);
  CHECK(q.key == "barrier");
  CHECK(q.delta == -7);

  f.clear();
  sd::encode_add(f, "big", std::numeric_limits<std::int64_t>::min());
  CHECK(decode(f, q) == nullptr);
  CHECK(q.delta == std::numeric_limits<std::int64_t>::min());

  f.clear();
  const std::vector<std::string> keys = {"a", "", binary_key, std::string(sd::kMaxKeyBytes, 'x')};
  sd::encode_wait(f, 0, keys);
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kWait);
  CHECK(q.wait_ms == 0);
  REQUIRE(q.keys.size() == keys.size());
  for (std::size_t i = 0; i < keys.size(); ++i) CHECK(q.keys[i] == keys[i]);

  f.clear();
  sd::encode_wait(f, 5, std::vector<std::string>{});
  CHECK(decode(f, q) == nullptr);
  CHECK(q.keys.empty());

  f.clear();
  sd::encode_erase(f, "gone");
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kErase);
  CHECK(q.key == "gone");

  f.clear();
  sd::encode_compare_set(f, binary_key, std::string("e\0", 2), std::string("d\0d", 3));
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kCompareSet);
  CHECK(q.key == binary_key);
  CHECK(q.expected == std::string("e\0", 2));
  CHECK(q.value == std::string("d\0d", 3));
  // Layout: key:string | expected:string | desired: the rest of the frame.
  std::string by_hand;
  sd::put_u32(by_hand, 1 + 4 + 1 + 4 + 2 + 1);
  by_hand += std::string("\x06", 1);
  sd::put_u32(by_hand, 1);
  by_hand += "k";
  sd::put_u32(by_hand, 2);
  by_hand += "ex";
  by_hand += "d";
  f.clear();
  sd::encode_compare_set(f, "k", "ex", "d");
  CHECK(f == by_hand);

  // Empty expected (the write-once form) and empty desired decode as empty, and the fields of
  // an earlier request do not leak into a later one.
  f.clear();
  sd::encode_compare_set(f, "decision", "", "");
  CHECK(decode(f, q) == nullptr);
  CHECK(q.op == sd::kCompareSet);
  CHECK(q.key == "decision");
  CHECK(q.expected.empty());
  CHECK(q.value.empty());
  f.clear();
  sd::encode_get(f, 0, "x");
  CHECK(decode(f, q) == nullptr);
  CHECK(q.expected.empty());
}

TEST_CASE("store protocol: frames split a stream, a bad length is refused") {
  std::string stream;
  sd::encode_get(stream, 1, "a");
  sd::encode_erase(stream, "b");
  std::string_view rest = stream;
  sd::FrameHead h = sd::peek_frame(rest);
  REQUIRE(h.state == sd::FrameState::complete);
  rest.remove_prefix(4 + std::size_t{h.len});
  h = sd::peek_frame(rest);
  REQUIRE(h.state == sd::FrameState::complete);
  rest.remove_prefix(4 + std::size_t{h.len});
  CHECK(rest.empty());
  CHECK(sd::peek_frame(rest).state == sd::FrameState::incomplete);

  // Every strict prefix of a frame is incomplete, never complete or bad.
  std::string one;
  sd::encode_set(one, "key", "value");
  for (std::size_t n = 0; n < one.size(); ++n) {
    CHECK(sd::peek_frame(std::string_view(one).substr(0, n)).state == sd::FrameState::incomplete);
  }

  std::string zero(4, '\0');
  CHECK(sd::peek_frame(zero).state == sd::FrameState::bad_length);
  std::string huge;
  sd::put_u32(huge, static_cast<std::uint32_t>(sd::kMaxFrameBytes + 1));
  CHECK(sd::peek_frame(huge).state == sd::FrameState::bad_length);
  CHECK(sd::peek_frame(huge).len == sd::kMaxFrameBytes + 1);
  std::string max;
  sd::put_u32(max, static_cast<std::uint32_t>(sd::kMaxFrameBytes));
  CHECK(sd::peek_frame(max).state == sd::FrameState::incomplete);
}

TEST_CASE("store protocol: truncated, oversized and garbage requests say what is wrong") {
  sd::Request q;
  // Each request cut short at every byte is refused, with its op's name.
  const auto truncations = [&](const std::string& frame, const char* why) {
    const std::string_view body = body_of(frame);
    for (std::size_t n = 1; n < body.size(); ++n) {
      const char* bad = sd::decode_request(body.substr(0, n), q);
      REQUIRE(bad != nullptr);
      CHECK(std::string(bad) == why);
    }
  };
  std::string f;
  sd::encode_get(f, 9, "key");
  truncations(f, "bad GET");
  f.clear();
  sd::encode_add(f, "key", 3);
  truncations(f, "bad ADD");
  f.clear();
  sd::encode_wait(f, 9, std::vector<std::string>{"k1", "k2"});
  truncations(f, "bad WAIT");
  f.clear();
  sd::encode_erase(f, "key");
  truncations(f, "bad ERASE");
  // COMPARE_SET's desired value is the rest of the frame: a cut inside the key or expected is
  // malformed, one inside desired is a shorter desired value.
  f.clear();
  sd::encode_compare_set(f, "key", "old", "new");
  for (std::size_t n = 1; n < 1 + 4 + 3 + 4 + 3; ++n) {
    CHECK(std::string(sd::decode_request(body_of(f).substr(0, n), q)) == "bad COMPARE_SET");
  }
  CHECK(sd::decode_request(body_of(f).substr(0, body_of(f).size() - 1), q) == nullptr);
  CHECK(q.value == "ne");
  // SET's value is the rest of the frame, so only a cut inside its key is malformed.
  f.clear();
  sd::encode_set(f, "key", "value");
  for (std::size_t n = 1; n < 1 + 4 + 3; ++n) {
    CHECK(std::string(sd::decode_request(body_of(f).substr(0, n), q)) == "bad SET");
  }

  // Trailing bytes after a complete request.
  f.clear();
  sd::encode_get(f, 9, "key");
  std::string body(body_of(f));
  CHECK(std::string(sd::decode_request(body + "x", q)) == "bad GET");

  // Unknown and missing ops.
  CHECK(std::string(sd::decode_request("", q)) == "unknown op");
  CHECK(std::string(sd::decode_request(std::string(1, '\0'), q)) == "unknown op");
  CHECK(std::string(sd::decode_request("\x07"
                                       "abc",
                                       q)) == "unknown op");
  CHECK(std::string(sd::decode_request("\xff", q)) == "unknown op");

  // A key over the limit.
  f.clear();
  sd::encode_get(f, 0, std::string(sd::kMaxKeyBytes + 1, 'k'));
  CHECK(std::string(decode(f, q)) == "bad GET");

  // A string length pointing past the frame.
  std::string lying;
  lying.push_back(static_cast<char>(sd::kErase));
  sd::put_u32(lying, 1000);
  lying += "short";
  CHECK(std::string(sd::decode_request(lying, q)) == "bad ERASE");

  // COMPARE_SET: an expected length past the frame, or beyond the value limit; a key over its
  // limit; a desired value over the value limit.
  std::string cas;
  cas.push_back(static_cast<char>(sd::kCompareSet));
  sd::put_u32(cas, 1);
  cas += "k";
  sd::put_u32(cas, 1000);
  cas += "short";
  CHECK(std::string(sd::decode_request(cas, q)) == "bad COMPARE_SET");
  cas.resize(1 + 4 + 1);
  sd::put_u32(cas, static_cast<std::uint32_t>(sd::kMaxValueBytes + 1));
  CHECK(std::string(sd::decode_request(cas, q)) == "bad COMPARE_SET");
  f.clear();
  sd::encode_compare_set(f, std::string(sd::kMaxKeyBytes + 1, 'k'), "", "v");
  CHECK(std::string(decode(f, q)) == "bad COMPARE_SET");
  cas.resize(1 + 4 + 1);
  sd::put_u32(cas, 0);
  cas.append(sd::kMaxValueBytes + 1, 'd');
  CHECK(std::string(sd::decode_request(cas, q)) == "COMPARE_SET value too large");
  cas.resize(cas.size() - 1);
  CHECK(sd::decode_request(cas, q) == nullptr);
  CHECK(q.value.size() == sd::kMaxValueBytes);

  // A WAIT claiming more keys than its frame could hold.
  std::string many;
  many.push_back(static_cast<char>(sd::kWait));
  sd::put_u64(many, 0);
  sd::put_u32(many, 0xffffffffu);
  CHECK(std::string(sd::decode_request(many, q)) == "bad WAIT");
}

TEST_CASE("store protocol: replies round-trip, malformed replies are refused") {
  sd::Reply r;
  std::string f;
  sd::encode_ok(f);
  REQUIRE(sd::decode_reply(body_of(f), r));
  CHECK(r.status == sd::kOk);
  CHECK(r.body.empty());

  f.clear();
  sd::encode_ok(f, "value");
  REQUIRE(sd::decode_reply(body_of(f), r));
  CHECK(r.body == "value");

  f.clear();
  sd::encode_ok_i64(f, -42);
  REQUIRE(sd::decode_reply(body_of(f), r));
  std::int64_t v = 0;
  REQUIRE(sd::decode_add_result(r.body, v));
  CHECK(v == -42);
  CHECK_FALSE(sd::decode_add_result("1234567", v));
  CHECK_FALSE(sd::decode_add_result("123456789", v));

  f.clear();
  const std::vector<std::string> missing = {"x", std::string("\0y", 2)};
  sd::encode_missing(f, missing);
  REQUIRE(sd::decode_reply(body_of(f), r));
  CHECK(r.status == sd::kMissing);
  std::vector<std::string> got;
  REQUIRE(sd::decode_missing(r.body, got));
  CHECK(got == missing);
  got.clear();
  CHECK_FALSE(sd::decode_missing(r.body.substr(0, r.body.size() - 1), got));
  got.clear();
  CHECK_FALSE(sd::decode_missing(std::string(r.body) + "z", got));

  f.clear();
  sd::encode_failed(f, "not an integer");
  REQUIRE(sd::decode_reply(body_of(f), r));
  CHECK(r.status == sd::kFailed);
  CHECK(r.body == "not an integer");

  CHECK_FALSE(sd::decode_reply("", r));
  CHECK_FALSE(sd::decode_reply("\x03", r));
}

TEST_CASE("store protocol: keys in messages are escaped and cut short") {
  CHECK(sd::printable("plain") == "'plain'");
  CHECK(sd::printable(std::string("a\0'\\", 4)) == "'a\\x00\\x27\\x5c'");
  const std::string long_key(200, 'k');
  CHECK(sd::printable(long_key, 10) == "'kkkkkkkkkk...(200 bytes)'");
  std::vector<std::string> keys(25, "k");
  const std::string list = sd::key_list(keys, 2);
  CHECK(list == "'k', 'k' and 23 more");
}
