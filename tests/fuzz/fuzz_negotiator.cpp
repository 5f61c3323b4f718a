// libFuzzer target: the engine's negotiation without a transport (engine/detail/negotiator.hpp):
// the request wire format (request.hpp) as every rank's gathered bytes, filed into the request
// table and decided, as a rank receives them from peers with their own ideas.
//
// Input: byte 0: ranks n = 1 + (bits 0-1), joined ranks (bits 2-5, bit 2 + r for rank r); then
// per rank len:u16 (little-endian) and that many bytes of its requests (short inputs: what is
// left). Two negotiators (rank 0 and rank n-1) file the same bytes, twice (two cycles).
// Checks, beyond ASan/UBSan: decoding either succeeds and re-encodes to exactly its bytes (the
// format is canonical) or throws kolo::Error "engine: truncated negotiation message"; filing
// throws nothing else; both ranks decide the same names with the same errors in the same order;
// no entry left in the table is ready; an allgather has a count per rank; the texts build.
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include <kolo/engine/detail/negotiator.hpp>

#include "fuzz_common.hpp"

namespace {

using namespace kolo::detail::engine;

constexpr const char* kTruncated = "engine: truncated negotiation message";

void check_chunk(const std::string& chunk) {
  try {
    const auto reqs = kolo::deserialize_requests(chunk);
    std::string again;
    for (const auto& r : reqs) kolo::serialize(again, r);
    KOLO_FUZZ_CHECK(again == chunk, "decoded requests do not re-encode to their own bytes");
  } catch (const kolo::Error& e) {
    KOLO_FUZZ_CHECK(std::string(e.what()) == kTruncated, std::string("unexpected: ") + e.what());
  }
}

// One cycle of rank `rank`: returns false when filing refused the bytes.
bool cycle(Negotiator& n, unsigned joined_mask, const std::string& all,
           const std::vector<std::size_t>& counts, std::deque<Decided>& out) {
  FlagsIn in;
  std::vector<std::uint8_t>& f = n.flags(in);
  // As the minimum over all ranks would leave them: 1 for the joined ranks.
  for (int r = 0; r < n.size(); ++r) f[3 + static_cast<std::size_t>(r)] = (joined_mask >> r) & 1;
  n.read_flags();
  try {
    n.file(all, counts, clock::now());
  } catch (const kolo::Error& e) {
    KOLO_FUZZ_CHECK(std::string(e.what()) == kTruncated, std::string("unexpected: ") + e.what());
    return false;
  }
  out.clear();
  n.decide_ready(out);
  for (const Decided& d : out) {
    if (d.error.empty() && d.p.kind == kolo::OpKind::allgather) {
      KOLO_FUZZ_CHECK(d.counts.size() == static_cast<std::size_t>(n.size()),
                      "an allgather without a count per rank");
    }
    (void)op_text(d.p);
  }
  for (const TableEntry& e : n.table()) {
    bool ready = true, any = false;
    for (std::size_t r = 0; r < e.by_rank.size(); ++r) {
      any = any || e.by_rank[r].has_value();
      ready = ready && (e.by_rank[r].has_value() || n.joined()[r]);
    }
    KOLO_FUZZ_CHECK(!(ready && any), "a ready name left in the table: " + e.name);
    (void)stall_text(e, n.joined());
  }
  (void)n.shutdown_reason(0, "");
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const int n = 1 + (data[0] & 3);
  const unsigned joined = (data[0] >> 2) & 0xF & ((1u << n) - 1);
  std::size_t pos = 1;
  std::string all;
  std::vector<std::size_t> counts;
  for (int r = 0; r < n; ++r) {
    std::size_t len = size - pos;
    if (size - pos >= 2) {
      len = std::min<std::size_t>(data[pos] | (data[pos + 1] << 8), size - pos - 2);
      pos += 2;
    }
    const std::string chunk(reinterpret_cast<const char*>(data + pos), len);
    pos += len;
    check_chunk(chunk);
    all += chunk;
    counts.push_back(len);
  }
  Negotiator first(0, n), last(n - 1, n);
  std::deque<Decided> a, b;
  for (int round = 0; round < 2; ++round) {
    const bool ok = cycle(first, joined, all, counts, a);
    KOLO_FUZZ_CHECK(cycle(last, joined, all, counts, b) == ok, "ranks disagree on the bytes");
    if (!ok) break;
    KOLO_FUZZ_CHECK(a.size() == b.size(), "ranks decided different numbers of names");
    for (std::size_t i = 0; i < a.size(); ++i) {
      KOLO_FUZZ_CHECK(
          a[i].name == b[i].name && a[i].error == b[i].error && a[i].counts == b[i].counts,
          "ranks decided differently: " + a[i].name);
    }
  }
  return 0;
}
