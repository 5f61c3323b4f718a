// kolo/topology/store/protocol.hpp — the rendezvous store's wire protocol as pure functions
// over byte buffers: framing, request and reply encoding and decoding. No sockets, no state, so
// the server's parser can be unit-tested and fuzzed on its own (tests/unit/test_store_protocol.cpp,
// tests/fuzz/fuzz_store_protocol.cpp).
//
// Wire protocol (after the handshake; every integer little-endian):
//
//   frame     := len:u32 | tag:u8 | payload        len counts tag + payload, 1..kMaxFrameBytes
//   string    := n:u32 | n bytes                   keys: n <= kMaxKeyBytes (4 KiB)
//
//   requests (tag = op)                            replies (tag = status)
//   SET   1 : key:string | value: rest of frame    OK
//   GET   2 : wait_ms:u64 | key:string             OK value: rest of frame  | MISSING
//   ADD   3 : key:string | delta:i64               OK new:i64               | FAILED
//   WAIT  4 : wait_ms:u64 | n:u32 | n x string     OK                       | MISSING
//   ERASE 5 : key:string                           OK
//   CAS   6 : key:string | expected:string |       OK value now stored: rest of frame
//             desired: rest of frame
//
//   OK 0 : as above;  MISSING 1 : n:u32 | n x string (the keys still absent);
//   FAILED 2 : message text (e.g. ADD on a value that is not an integer).
//
// A client sends one request and reads its reply before the next (the client's mutex), but the
// server also answers pipelined requests in order: it stops reading a connection's requests
// while that connection has a waiter parked. GET/WAIT with wait_ms = 0 answer at once (try_get,
// check); otherwise the server holds the request up to wait_ms and answers MISSING when it
// expires, so the connection stays in step and a timed-out get() leaves the client usable.
// ADD keeps counters as decimal text, so get() on a counter returns "42" (as torch's store does).
// CAS (compare-and-set) has torch's compareSet semantics: it stores `desired` if the key is absent
// and `expected` empty, or if the key holds `expected`; it replies with the value stored now, and
// with `expected` for an absent key and a non-empty `expected` (nothing is stored then).
// Anything malformed — a length out of range, an unknown op, a string overrunning its frame,
// trailing bytes — closes that connection without a reply.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace kolo {

namespace store_detail {

inline constexpr std::size_t kMaxKeyBytes = 4096;
inline constexpr std::size_t kMaxValueBytes = std::size_t{64} << 20;
// Room for the largest SET (key + value + headers); a WAIT's key list must fit in it too.
inline constexpr std::size_t kMaxFrameBytes = kMaxValueBytes + kMaxKeyBytes + 64;
// Stop reading a connection's requests while this much of its replies is still unsent: a client
// that never reads cannot make the server buffer without bound.
inline constexpr std::size_t kOutputHighWater = std::size_t{8} << 20;
// At most this much is read from one connection per loop turn, so one client streaming a huge
// value does not starve the rest.
inline constexpr std::size_t kReadBudgetPerTurn = std::size_t{4} << 20;
// The longest wait a request may ask for (~115 days): keeps deadline arithmetic far from overflow.
inline constexpr std::uint64_t kMaxWaitMs = std::uint64_t{10'000'000'000};

enum Op : std::uint8_t { kSet = 1, kGet = 2, kAdd = 3, kWait = 4, kErase = 5, kCompareSet = 6 };
enum Status : std::uint8_t { kOk = 0, kMissing = 1, kFailed = 2 };

inline void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline std::uint32_t load_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::uint32_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}
inline std::uint64_t load_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// Appends one frame to `out` in place (no intermediate copy of a large value); the length is
// patched in by finish().
class FrameWriter {
 public:
  FrameWriter(std::string& out, std::uint8_t tag) : out_(out), start_(out.size()) {
    put_u32(out_, 0);
    out_.push_back(static_cast<char>(tag));
  }
  FrameWriter& u32(std::uint32_t v) {
    put_u32(out_, v);
    return *this;
  }
  FrameWriter& u64(std::uint64_t v) {
    put_u64(out_, v);
    return *this;
  }
  FrameWriter& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  FrameWriter& str(std::string_view s) {
    put_u32(out_, static_cast<std::uint32_t>(s.size()));
    out_.append(s);
    return *this;
  }
  FrameWriter& raw(std::string_view s) {
    out_.append(s);
    return *this;
  }
  void finish() {
    const auto len = static_cast<std::uint32_t>(out_.size() - start_ - 4);
    for (int i = 0; i < 4; ++i) out_[start_ + i] = static_cast<char>((len >> (8 * i)) & 0xff);
  }

 private:
  std::string& out_;
  std::size_t start_;
};

// Bounds-checked decoding of one frame's payload: any overrun clears ok() instead of reading
// past the frame, so a hostile length field can only get its connection closed.
class FrameReader {
 public:
  explicit FrameReader(std::string_view s) : rest_(s) {}
  bool ok() const { return ok_; }
  bool at_end() const { return ok_ && rest_.empty(); }
  std::uint8_t u8() {
    if (!need(1)) return 0;
    const auto v = static_cast<std::uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return v;
  }
  std::uint32_t u32() {
    if (!need(4)) return 0;
    const auto v = load_u32(rest_.data());
    rest_.remove_prefix(4);
    return v;
  }
  std::uint64_t u64() {
    if (!need(8)) return 0;
    const auto v = load_u64(rest_.data());
    rest_.remove_prefix(8);
    return v;
  }
  std::int64_t i64() { return static_cast<std::int64_t>(u64()); }
  std::string_view str(std::size_t max_len) {
    const std::uint32_t n = u32();
    if (!ok_ || n > max_len || !need(n)) {
      ok_ = false;
      return {};
    }
    const auto v = rest_.substr(0, n);
    rest_.remove_prefix(n);
    return v;
  }
  std::string_view rest() {
    const auto v = rest_;
    rest_ = {};
    return v;
  }

 private:
  bool need(std::size_t n) {
    if (!ok_ || rest_.size() < n) ok_ = false;
    return ok_;
  }
  std::string_view rest_;
  bool ok_ = true;
};

// A key as it appears in messages: escaped (keys may be binary) and cut short if long.
inline std::string printable(std::string_view key, std::size_t max_len = 120) {
  std::string out = "'";
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (i == max_len) {
      out += "...(" + std::to_string(key.size()) + " bytes)";
      break;
    }
    const auto c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out + "'";
}

inline std::string key_list(const std::vector<std::string>& keys, std::size_t max_shown = 20) {
  std::string out;
  for (std::size_t i = 0; i < keys.size() && i < max_shown; ++i) {
    if (i) out += ", ";
    out += printable(keys[i]);
  }
  if (keys.size() > max_shown) {
    out += " and " + std::to_string(keys.size() - max_shown) + " more";
  }
  return out;
}

inline std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

// ---- framing ----

// Where the next frame of a byte stream stands: not all here yet, whole, or with a length
// outside 1..kMaxFrameBytes (the connection is then unusable: nothing after it can be trusted).
enum class FrameState { incomplete, complete, bad_length };

struct FrameHead {
  FrameState state = FrameState::incomplete;
  std::uint32_t len = 0;  // tag + payload; valid unless incomplete for lack of the 4 length bytes
};

// Looks at the start of `buffered` (unconsumed stream bytes): a complete frame occupies
// 4 + len bytes, its body (tag + payload) being buffered.substr(4, len).
inline FrameHead peek_frame(std::string_view buffered) {
  FrameHead h;
  if (buffered.size() < 4) return h;
  h.len = load_u32(buffered.data());
  if (h.len == 0 || h.len > kMaxFrameBytes) {
    h.state = FrameState::bad_length;
  } else if (buffered.size() >= 4 + std::size_t{h.len}) {
    h.state = FrameState::complete;
  }
  return h;
}

// ---- requests ----

// One request as decoded from a frame body (tag + payload). The views point into that body.
struct Request {
  Op op = kSet;
  std::string_view key;                // SET, GET, ADD, ERASE, CAS
  std::string_view value;              // SET; CAS: desired
  std::string_view expected;           // CAS
  std::int64_t delta = 0;              // ADD
  std::uint64_t wait_ms = 0;           // GET, WAIT
  std::vector<std::string_view> keys;  // WAIT
};

// Decodes one request frame body into `out`; returns why it is malformed ("bad GET", "unknown
// op", ...: what the server logs before closing the connection), or nullptr.
inline const char* decode_request(std::string_view body, Request& out) {
  FrameReader r(body);
  const std::uint8_t op = r.u8();
  out.keys.clear();
  out.key = {};
  out.value = {};
  out.expected = {};
  out.delta = 0;
  out.wait_ms = 0;
  switch (op) {
    case kSet:
      out.key = r.str(kMaxKeyBytes);
      out.value = r.rest();
      if (!r.ok()) return "bad SET";
      if (out.value.size() > kMaxValueBytes) return "SET value too large";
      break;
    case kGet:
      out.wait_ms = r.u64();
      out.key = r.str(kMaxKeyBytes);
      if (!r.at_end()) return "bad GET";
      break;
    case kAdd:
      out.key = r.str(kMaxKeyBytes);
      out.delta = r.i64();
      if (!r.at_end()) return "bad ADD";
      break;
    case kWait: {
      out.wait_ms = r.u64();
      const std::uint32_t n = r.u32();
      // Each key costs at least its 4-byte length, so n is bounded by the frame already.
      if (!r.ok() || n > body.size() / 4) return "bad WAIT";
      out.keys.reserve(n);
      for (std::uint32_t i = 0; i < n && r.ok(); ++i) out.keys.push_back(r.str(kMaxKeyBytes));
      if (!r.at_end()) return "bad WAIT";
      break;
    }
    case kErase:
      out.key = r.str(kMaxKeyBytes);
      if (!r.at_end()) return "bad ERASE";
      break;
    case kCompareSet:
      out.key = r.str(kMaxKeyBytes);
      out.expected = r.str(kMaxValueBytes);
      out.value = r.rest();
      if (!r.ok()) return "bad COMPARE_SET";
      if (out.value.size() > kMaxValueBytes) return "COMPARE_SET value too large";
      break;
    default:
      return "unknown op";
  }
  out.op = static_cast<Op>(op);
  return nullptr;
}

// Request encoders: each appends one whole frame to `out`. The caller checks the limits
// (StoreClient names the key in its message); decode_request rejects what exceeds them.
inline void encode_set(std::string& out, std::string_view key, std::string_view value) {
  FrameWriter(out, kSet).str(key).raw(value).finish();
}
inline void encode_get(std::string& out, std::uint64_t wait_ms, std::string_view key) {
  FrameWriter(out, kGet).u64(wait_ms).str(key).finish();
}
inline void encode_add(std::string& out, std::string_view key, std::int64_t delta) {
  FrameWriter(out, kAdd).str(key).i64(delta).finish();
}
template <class Keys>
void encode_wait(std::string& out, std::uint64_t wait_ms, const Keys& keys) {
  FrameWriter w(out, kWait);
  w.u64(wait_ms).u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.finish();
}
inline void encode_erase(std::string& out, std::string_view key) {
  FrameWriter(out, kErase).str(key).finish();
}
inline void encode_compare_set(std::string& out, std::string_view key, std::string_view expected,
                               std::string_view desired) {
  FrameWriter(out, kCompareSet).str(key).str(expected).raw(desired).finish();
}

// ---- replies ----

// Reply encoders (the server's): OK with an optional body, OK with ADD's new value, MISSING with
// the keys still absent, FAILED with a message.
inline void encode_ok(std::string& out, std::string_view body = {}) {
  FrameWriter(out, kOk).raw(body).finish();
}
inline void encode_ok_i64(std::string& out, std::int64_t v) {
  FrameWriter(out, kOk).i64(v).finish();
}
template <class Keys>
void encode_missing(std::string& out, const Keys& keys) {
  FrameWriter w(out, kMissing);
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const auto& k : keys) w.str(k);
  w.finish();
}
inline void encode_failed(std::string& out, std::string_view message) {
  FrameWriter(out, kFailed).raw(message).finish();
}

// One reply as decoded from a frame body: its status and what follows it.
struct Reply {
  std::uint8_t status = 0;
  std::string_view body;
};

// Splits a reply frame body; false for an empty body or an unknown status.
inline bool decode_reply(std::string_view frame_body, Reply& out) {
  if (frame_body.empty()) return false;
  out.status = static_cast<std::uint8_t>(frame_body[0]);
  out.body = frame_body.substr(1);
  return out.status == kOk || out.status == kMissing || out.status == kFailed;
}

// A MISSING reply's body: the keys still absent. False if it is malformed (keys appended so far
// stay in `keys`).
inline bool decode_missing(std::string_view body, std::vector<std::string>& keys) {
  FrameReader r(body);
  const std::uint32_t n = r.u32();
  for (std::uint32_t i = 0; i < n && r.ok(); ++i) keys.emplace_back(r.str(kMaxKeyBytes));
  return r.at_end();
}

// An OK reply to ADD: the counter's new value. False unless the body is exactly 8 bytes.
inline bool decode_add_result(std::string_view body, std::int64_t& value) {
  if (body.size() != 8) return false;
  value = static_cast<std::int64_t>(load_u64(body.data()));
  return true;
}

}  // namespace store_detail

}  // namespace kolo
