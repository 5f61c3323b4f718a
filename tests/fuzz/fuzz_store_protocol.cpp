// libFuzzer target: the rendezvous store's wire protocol on its own (topology/store/protocol.hpp),
// no sockets: thousands of times faster than fuzz_store, which drives the whole server.
//
// The first byte chooses what the rest is:
//   bit 0 clear  a stream of request frames, as a client sends them to the server: split with
//                peek_frame, each body decoded with decode_request;
//   bit 0 set    a stream of reply frames, as the server sends them to a client: decode_reply,
//                then decode_missing / decode_add_result on the bodies that carry them.
// Checks, beyond the sanitizers: the decoders never accept what breaks the protocol's limits
// (a key over kMaxKeyBytes, a value over kMaxValueBytes, more WAIT keys than the frame could
// hold), a refused request says why in one of the server's known texts, and everything that is
// accepted re-encodes to exactly the bytes it came from (the encoding is canonical), so encoder
// and decoder agree on every input the fuzzer finds.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <kolo/topology/store/protocol.hpp>

#include "fuzz_common.hpp"

namespace {

namespace sd = kolo::store_detail;

bool known_refusal(std::string_view why) {
  for (const char* k :
       {"bad SET", "SET value too large", "bad GET", "bad ADD", "bad WAIT", "bad ERASE",
        "bad COMPARE_SET", "COMPARE_SET value too large", "unknown op"}) {
    if (why == k) return true;
  }
  return false;
}

void check_request(std::string_view frame, std::string_view body, sd::Request& q) {
  const char* bad = sd::decode_request(body, q);
  if (bad) {
    KOLO_FUZZ_CHECK(known_refusal(bad), std::string("unexpected refusal text: ") + bad);
    return;
  }
  std::string again;
  switch (q.op) {
    case sd::kSet:
      KOLO_FUZZ_CHECK(q.value.size() <= sd::kMaxValueBytes, "SET value over the limit accepted");
      sd::encode_set(again, q.key, q.value);
      break;
    case sd::kGet:
      sd::encode_get(again, q.wait_ms, q.key);
      break;
    case sd::kAdd:
      sd::encode_add(again, q.key, q.delta);
      break;
    case sd::kWait:
      KOLO_FUZZ_CHECK(q.keys.size() <= body.size() / 4, "more WAIT keys than the frame holds");
      for (const auto k : q.keys) {
        KOLO_FUZZ_CHECK(k.size() <= sd::kMaxKeyBytes, "a WAIT key over the limit accepted");
      }
      sd::encode_wait(again, q.wait_ms, q.keys);
      break;
    case sd::kErase:
      sd::encode_erase(again, q.key);
      break;
    case sd::kCompareSet:
      KOLO_FUZZ_CHECK(
          q.expected.size() <= sd::kMaxValueBytes && q.value.size() <= sd::kMaxValueBytes,
          "a COMPARE_SET value over the limit accepted");
      sd::encode_compare_set(again, q.key, q.expected, q.value);
      break;
    default:
      kolo_fuzz::fail("decode_request accepted op " + std::to_string(q.op));
  }
  KOLO_FUZZ_CHECK(q.key.size() <= sd::kMaxKeyBytes, "a key over the limit accepted");
  KOLO_FUZZ_CHECK(again == frame, "a decoded request does not re-encode to its own bytes");
}

void check_reply(std::string_view frame, std::string_view body) {
  sd::Reply r;
  if (!sd::decode_reply(body, r)) {
    KOLO_FUZZ_CHECK(body.empty() || (static_cast<std::uint8_t>(body[0]) != sd::kOk &&
                                     static_cast<std::uint8_t>(body[0]) != sd::kMissing &&
                                     static_cast<std::uint8_t>(body[0]) != sd::kFailed),
                    "a reply with a known status refused");
    return;
  }
  std::string again;
  if (r.status == sd::kMissing) {
    std::vector<std::string> keys;
    if (!sd::decode_missing(r.body, keys)) return;
    for (const auto& k : keys) {
      KOLO_FUZZ_CHECK(k.size() <= sd::kMaxKeyBytes, "a MISSING key over the limit accepted");
    }
    sd::encode_missing(again, keys);
  } else if (r.status == sd::kFailed) {
    sd::encode_failed(again, r.body);
  } else {
    std::int64_t v = 0;
    if (sd::decode_add_result(r.body, v)) {
      sd::encode_ok_i64(again, v);
    } else {
      KOLO_FUZZ_CHECK(r.body.size() != 8, "an 8-byte OK body refused as ADD's result");
      sd::encode_ok(again, r.body);
    }
  }
  KOLO_FUZZ_CHECK(again == frame, "a decoded reply does not re-encode to its own bytes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kolo_fuzz::Input in(data, size);
  const bool replies = (in.u8() & 1) != 0;
  std::string_view stream = in.rest();
  sd::Request q;  // reused, as the server reuses its own
  for (;;) {
    const sd::FrameHead h = sd::peek_frame(stream);
    if (h.state == sd::FrameState::bad_length) {
      KOLO_FUZZ_CHECK(h.len == 0 || h.len > sd::kMaxFrameBytes, "a good length refused");
      break;
    }
    if (h.state == sd::FrameState::incomplete) {
      KOLO_FUZZ_CHECK(stream.size() < 4 || stream.size() < 4 + std::size_t{h.len},
                      "a whole frame called incomplete");
      break;
    }
    const std::string_view frame = stream.substr(0, 4 + std::size_t{h.len});
    const std::string_view body = frame.substr(4);
    if (replies) {
      check_reply(frame, body);
    } else {
      check_request(frame, body, q);
    }
    stream.remove_prefix(frame.size());
  }
  return 0;
}
