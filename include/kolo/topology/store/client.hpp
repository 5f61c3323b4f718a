// kolo/topology/store/client.hpp — the rendezvous store's client: StoreClient, kolo's KvStore
// over one authenticated connection to a StoreServer, one request and its reply at a time (the
// frames come from store/protocol.hpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/auth.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/topology/kv_store.hpp"
#include "kolo/topology/store/protocol.hpp"

namespace kolo {

class StoreClient final : public KvStore {
 public:
  // Connects (retrying until timeout: the server may not be up yet) and authenticates with
  // Hello{kPurposeStore, rank}. `timeout_seconds` bounds the connect and every later call.
  StoreClient(const net::HostPort& addr, std::string secret, int rank, double timeout_seconds)
      : addr_(addr), who_("store " + addr.str()), timeout_(timeout_seconds) {
    if (!(timeout_seconds > 0)) {
      throw ConfigError("StoreClient for " + addr_.str() +
                        ": timeout_seconds must be positive (got " +
                        store_detail::seconds_text(timeout_seconds) + ")");
    }
    const Deadline dl = Deadline::after(timeout_);
    try {
      // Retries while the store is at its handshake cap (a flood of strangers).
      sock_ = net::connect_authenticated(addr_.host, addr_.port, secret,
                                         net::Hello{net::kPurposeStore, rank, 0}, dl, who_);
    } catch (const TimeoutError& e) {
      if (std::string_view(e.what()).find("cannot connect to") != std::string_view::npos) throw;
      throw TimeoutError(who_ +
                         " accepted the connection but did not complete authentication "
                         "within " +
                         store_detail::seconds_text(timeout_) +
                         " s (is a kolo store serving there?): " + e.what());
    }
  }

  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  // Binary-safe: keys up to 4 KiB, values up to 64 MiB.
  void set(const std::string& key, const std::string& value) override {
    check_key(key);
    if (value.size() > store_detail::kMaxValueBytes) {
      throw Error("store set(" + store_detail::printable(key) + "): value of " +
                  std::to_string(value.size()) + " bytes exceeds the " +
                  std::to_string(store_detail::kMaxValueBytes) + "-byte limit");
    }
    std::string req;
    req.reserve(key.size() + value.size() + 16);
    store_detail::encode_set(req, key, value);
    const Reply r = call("set(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "set", key);
  }

  // Blocks until the key exists; TimeoutError naming the key and the store after the timeout.
  std::string get(const std::string& key) override {
    check_key(key);
    std::string req;
    store_detail::encode_get(req, wait_ms(), key);
    const std::string what = "get(" + store_detail::printable(key) + ")";
    Reply r = call(what, req, true);
    if (r.status == store_detail::kMissing) {
      throw TimeoutError("store " + what + " timed out after " +
                         store_detail::seconds_text(timeout_) + " s: key " +
                         store_detail::printable(key) + " was not set at " + who_);
    }
    expect_ok(r, "get", key);
    return std::move(r.body);
  }

  // The value if the key exists now; never waits for it.
  std::optional<std::string> try_get(const std::string& key) override {
    check_key(key);
    std::string req;
    store_detail::encode_get(req, 0, key);
    Reply r = call("try_get(" + store_detail::printable(key) + ")", req, false);
    if (r.status == store_detail::kMissing) return std::nullopt;
    expect_ok(r, "try_get", key);
    return std::move(r.body);
  }

  // Atomic on the server; a missing key counts as 0. Returns the new value.
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    check_key(key);
    std::string req;
    store_detail::encode_add(req, key, delta);
    const Reply r = call("add(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "add", key);
    std::int64_t value = 0;
    if (!store_detail::decode_add_result(r.body, value)) malformed("add");
    return value;
  }

  // Until all keys exist; TimeoutError lists the ones still missing.
  void wait(const std::vector<std::string>& keys) override {
    if (keys.empty()) return;
    const Reply r = call("wait", wait_request(keys, wait_ms()), true);
    if (r.status == store_detail::kMissing) {
      const auto missing = decode_missing(r, "wait");
      throw TimeoutError("store wait for " + std::to_string(keys.size()) +
                         " key(s) timed out after " + store_detail::seconds_text(timeout_) +
                         " s at " + who_ + "; still missing: " + store_detail::key_list(missing));
    }
    expect_ok(r, "wait", keys.front());
  }

  // Until all keys exist or `seconds` pass (<= 0: checks once): true when all exist, false on
  // expiry (the server answers MISSING; the connection stays usable). Not bounded by the
  // client's timeout: the server holds the request up to `seconds` (at most ~115 days).
  bool wait_for(const std::vector<std::string>& keys, double seconds) override {
    if (keys.empty()) return true;
    const double held = std::isnan(seconds) ? 0.0 : std::clamp(seconds, 0.0, 1e7);
    const auto ms = static_cast<std::uint64_t>(std::ceil(held * 1000.0));
    const Reply r = call_held("wait_for", wait_request(keys, ms), ms == 0 ? 0.0 : held);
    if (r.status == store_detail::kMissing) {
      (void)decode_missing(r, "wait_for");  // well-formed, or the connection is dropped
      return false;
    }
    expect_ok(r, "wait_for", keys.front());
    return true;
  }

  // Atomic on the server, torch's compareSet semantics (KvStore::compare_set): stores `desired`
  // if the key is absent and `expected` empty, or holds `expected`; returns the value stored now
  // (`expected` for an absent key and a non-empty `expected`). Binary-safe; values up to 64 MiB,
  // expected + desired together within one frame.
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override {
    check_key(key);
    const std::size_t bytes = key.size() + expected.size() + desired.size() + 16;
    if (expected.size() > store_detail::kMaxValueBytes ||
        desired.size() > store_detail::kMaxValueBytes || bytes > store_detail::kMaxFrameBytes) {
      throw Error("store compare_set(" + store_detail::printable(key) + "): values of " +
                  std::to_string(expected.size()) + " + " + std::to_string(desired.size()) +
                  " bytes exceed the " + std::to_string(store_detail::kMaxValueBytes) +
                  "-byte limit (each) or the " + std::to_string(store_detail::kMaxFrameBytes) +
                  "-byte request limit (together)");
    }
    std::string req;
    req.reserve(bytes);
    store_detail::encode_compare_set(req, key, expected, desired);
    Reply r = call("compare_set(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "compare_set", key);
    return std::move(r.body);
  }

  // Do all keys exist now?
  bool check(const std::vector<std::string>& keys) {
    if (keys.empty()) return true;
    const Reply r = call("check", wait_request(keys, 0), false);
    if (r.status == store_detail::kMissing) return false;
    expect_ok(r, "check", keys.front());
    return true;
  }

  // Removes the key if it exists (a missing key is not an error).
  void erase(const std::string& key) override {
    check_key(key);
    std::string req;
    store_detail::encode_erase(req, key);
    const Reply r = call("erase(" + store_detail::printable(key) + ")", req, false);
    expect_ok(r, "erase", key);
  }

  double timeout_seconds() const { return timeout_; }
  std::optional<net::HostPort> address() const override { return addr_; }
  std::string describe() const override { return who_; }

 private:
  struct Reply {
    std::uint8_t status = 0;
    std::string body;
  };

  void check_key(const std::string& key) const {
    if (key.size() > store_detail::kMaxKeyBytes) {
      throw Error("store key " + store_detail::printable(key, 40) + " is " +
                  std::to_string(key.size()) + " bytes long; the limit is " +
                  std::to_string(store_detail::kMaxKeyBytes));
    }
  }

  std::uint64_t wait_ms() const {
    return static_cast<std::uint64_t>(std::clamp(std::ceil(timeout_ * 1000.0), 1.0,
                                                 static_cast<double>(store_detail::kMaxWaitMs)));
  }

  std::string wait_request(const std::vector<std::string>& keys, std::uint64_t wait_ms) const {
    std::size_t bytes = 32;
    for (const auto& k : keys) {
      check_key(k);
      bytes += 4 + k.size();
    }
    if (bytes > store_detail::kMaxFrameBytes) {
      throw Error("store wait/check on " + std::to_string(keys.size()) + " keys (" +
                  std::to_string(bytes) + " bytes) exceeds the " +
                  std::to_string(store_detail::kMaxFrameBytes) + "-byte request limit");
    }
    std::string req;
    req.reserve(bytes);
    store_detail::encode_wait(req, wait_ms, keys);
    return req;
  }

  // One request/response under the mutex. `waits`: the server may hold the reply up to the
  // timeout, so our own deadline gets a grace period on top — the server's MISSING answer must
  // arrive first, or the connection would fall out of step with a late reply still in flight.
  Reply call(const std::string& what, const std::string& request, bool waits) {
    return call_held(what, request, waits ? timeout_ : 0.0);
  }

  // The same for a request the server may hold up to `held` seconds (0: answered at once): our
  // deadline is the timeout, or `held` plus its grace period when that is longer.
  Reply call_held(const std::string& what, const std::string& request, double held) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!sock_.valid()) {
      throw PeerLostError(who_ + " is unreachable for " + what +
                          ": the connection was lost earlier (" + lost_ + ")");
    }
    const double limit = held > 0 ? std::max(timeout_, held + 1.0 + 0.05 * held) : timeout_;
    const Deadline dl = Deadline::after(limit);
    Reply r;
    try {
      net::send_all(sock_.fd(), request.data(), request.size(), dl, who_);
      char head[4];
      net::recv_all(sock_.fd(), head, sizeof(head), dl, who_);
      const std::uint32_t len = store_detail::load_u32(head);
      if (len == 0 || len > store_detail::kMaxFrameBytes) {
        lose("reply length " + std::to_string(len) + " out of range");
        throw Error(who_ + " sent a malformed reply to " + what + " (length " +
                    std::to_string(len) + "); is it a kolo store?");
      }
      r.body.resize(len);
      net::recv_all(sock_.fd(), r.body.data(), len, dl, who_);
    } catch (const TimeoutError& e) {
      // The reply may still come: the stream is out of step, so this connection is finished.
      lose(e.what());
      throw TimeoutError("store " + what + " at " + who_ + " got no reply within " +
                         store_detail::seconds_text(limit) + " s: " + e.what());
    } catch (const PeerLostError& e) {
      lose(e.what());
      throw PeerLostError(who_ + " was lost during " + what + ": " + e.what());
    }
    r.status = static_cast<std::uint8_t>(r.body[0]);
    r.body.erase(0, 1);
    return r;
  }

  void lose(const std::string& why) {
    sock_.close();
    lost_ = why;
  }

  [[noreturn]] void malformed(const std::string& what) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      lose("malformed reply");
    }
    throw Error(who_ + " sent a malformed reply to " + what + "; is it a kolo store?");
  }

  void expect_ok(const Reply& r, const std::string& what, const std::string& key) {
    if (r.status == store_detail::kOk) return;
    if (r.status == store_detail::kFailed) throw Error(r.body + " (at " + who_ + ")");
    malformed(what + "(" + store_detail::printable(key) + ")");
  }

  std::vector<std::string> decode_missing(const Reply& r, const std::string& what) {
    std::vector<std::string> keys;
    if (!store_detail::decode_missing(r.body, keys)) malformed(what);
    return keys;
  }

  net::HostPort addr_;
  std::string who_;  // "store host:port", for messages
  double timeout_;
  std::mutex mu_;     // one request/response at a time on the connection
  net::Socket sock_;  // invalid once lost
  std::string lost_;  // why it was lost
};

}  // namespace kolo
