// Unit tests of the engine's negotiator (engine/detail/negotiator.hpp) without a transport:
// several simulated ranks on one thread, each a Negotiator, exchanged step by step through an
// in-memory exchange (the flags' minimum, the requests' concatenation).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "engine_unit_common.hpp"
#include "kolo/engine/detail/negotiator.hpp"

namespace {

using namespace engine_unit;
using namespace kolo::detail::engine;

// N ranks' negotiators and the in-memory exchange between them.
struct Ranks {
  std::vector<Negotiator> at;
  std::vector<std::deque<Decided>> decided;
  explicit Ranks(int n) : decided(static_cast<std::size_t>(n)) {
    for (int r = 0; r < n; ++r) at.emplace_back(r, n);
  }
  // Phase 1: every rank's flags, their minimum handed back to every rank, read.
  void flags(const std::vector<FlagsIn>& in) {
    std::vector<std::vector<std::uint8_t>*> fs;
    for (std::size_t r = 0; r < at.size(); ++r) fs.push_back(&at[r].flags(in[r]));
    std::vector<std::uint8_t> m = *fs.front();
    for (auto* f : fs) {
      REQUIRE(f->size() == m.size());
      for (std::size_t i = 0; i < m.size(); ++i) m[i] = std::min(m[i], (*f)[i]);
    }
    for (std::size_t r = 0; r < at.size(); ++r) {
      *fs[r] = m;
      at[r].read_flags();
    }
  }
  // Plain flags: nothing cached, `joined` ranks joined.
  void flags(std::vector<bool> joined = {}) {
    std::vector<FlagsIn> in(at.size());
    for (std::size_t r = 0; r < joined.size(); ++r) in[r].joined = joined[r];
    flags(in);
  }
  // Phase 2: every rank's encoded requests, concatenated, filed and decided on every rank.
  void exchange(const std::vector<std::string>& mine, kolo::detail::engine::clock::time_point now) {
    std::string all;
    std::vector<std::size_t> counts;
    for (const auto& m : mine) {
      all += m;
      counts.push_back(m.size());
    }
    for (std::size_t r = 0; r < at.size(); ++r) {
      decided[r].clear();
      at[r].file(all, counts, now);
      at[r].decide_ready(decided[r]);
    }
  }
  void exchange(const std::vector<std::string>& mine) {
    exchange(mine, kolo::detail::engine::clock::now());
  }
};

std::string encode(std::initializer_list<std::pair<std::string, RequestParams>> reqs) {
  std::string s;
  for (const auto& [name, p] : reqs) Negotiator::encode(s, name, p);
  return s;
}

// One rank through the Exchange interface, the way EngineCore binds it to a communicator.
struct LoopbackExchange final : Exchange {
  int mins = 0, gathers = 0;
  void min(std::vector<std::uint8_t>&) override { ++mins; }
  void gather(const std::string& mine, std::string& all,
              std::vector<std::size_t>& counts) override {
    ++gathers;
    all = mine;
    counts.assign(1, mine.size());
  }
};

}  // namespace

TEST_CASE("negotiator: cached slots are ready where every rank has them pending") {
  Ranks ranks(3);
  const std::vector<std::uint8_t> pend0{1, 1}, pend1{1, 0}, pend2{1, 1};
  const std::vector<std::uint8_t> ok{0, 0}, bad1{0, 1};
  std::vector<FlagsIn> in(3);
  in[0].pending = &pend0;
  in[0].invalid = &ok;
  in[1].pending = &pend1;
  in[1].invalid = &ok;
  in[2].pending = &pend2;
  in[2].invalid = &bad1;  // rank 2 wants slot 1 dropped
  ranks.flags(in);
  for (const Negotiator& n : ranks.at) {
    CHECK(n.slot_ready(0));
    CHECK_FALSE(n.slot_ready(1));
    CHECK_FALSE(n.slot_evicted(0));
    CHECK(n.slot_evicted(1));
    CHECK_FALSE(n.new_names());
    CHECK_FALSE(n.shutdown());
    CHECK_FALSE(n.all_joined());
    CHECK(n.active() == 3);
  }
}

TEST_CASE("negotiator: a joined rank counts as pending everywhere and is named joined") {
  Ranks ranks(3);
  const std::vector<std::uint8_t> none{0}, yes{1}, ok{0};
  std::vector<FlagsIn> in(3);
  in[0].pending = &yes;
  in[1].pending = &none;  // joined: its zero does not count
  in[1].joined = true;
  in[2].pending = &yes;
  for (auto& i : in) i.invalid = &ok;
  ranks.flags(in);
  const Negotiator& n = ranks.at[0];
  CHECK(n.slot_ready(0));
  CHECK(n.joined() == std::vector<bool>{false, true, false});
  CHECK(n.active() == 2);
  CHECK_FALSE(n.all_joined());
  ranks.flags({true, true, true});
  CHECK(ranks.at[2].all_joined());
  CHECK(ranks.at[2].active() == 0);
}

TEST_CASE("negotiator: a shutdown names the rank that asked, the same words on every rank") {
  Ranks ranks(3);
  std::vector<FlagsIn> in(3);
  in[2].want_shutdown = true;
  ranks.flags(in);
  for (const Negotiator& n : ranks.at) {
    CHECK(n.shutdown());
    CHECK_FALSE(n.by_stall());
    CHECK(n.stopped() == std::vector<int>{2});
  }
  const std::string r0 = ranks.at[0].shutdown_reason(0, "");
  CHECK(r0.rfind("engine shut down by rank 2, which called Engine::shutdown() or destroyed its "
                 "Engine. If ranks run different numbers of steps",
                 0) == 0);
  const std::string r2 = ranks.at[2].shutdown_reason(1, "'w'; allreduce(sum)");
  CHECK(r2.find("by rank 2 (this rank), which") != std::string::npos);
  CHECK(r2.find("; this rank was still waiting for 1 tensor ('w'; allreduce(sum))") !=
        std::string::npos);

  std::vector<FlagsIn> stall(3);
  stall[0].stall_stop = true;
  ranks.flags(stall);
  CHECK(ranks.at[1].shutdown());
  CHECK(ranks.at[1].by_stall());
  CHECK(ranks.at[1].shutdown_reason(0, "").rfind(
            "engine shut down by the stall inspector (rank 0, KOLO_STALL_SHUTDOWN_SECONDS).", 0) ==
        0);
}

TEST_CASE("negotiator: a name is decided once every rank submitted it, in table order") {
  Ranks ranks(3);
  std::vector<FlagsIn> in(3);
  in[1].has_new = true;
  ranks.flags(in);
  CHECK(ranks.at[0].new_names());
  const auto t0 = kolo::detail::engine::clock::now();
  ranks.exchange(
      {encode({{"a", allreduce(4)}, {"b", allreduce(8)}}),
       encode({{"b", allreduce(8)}, {"a", allreduce(4)}}), encode({{"a", allreduce(4)}})},
      t0);
  for (std::size_t r = 0; r < 3; ++r) {
    REQUIRE(ranks.decided[r].size() == 1);
    const Decided& d = ranks.decided[r][0];
    CHECK(d.name == "a");
    CHECK(d.p == allreduce(4));
    CHECK(d.error.empty());
    CHECK(Negotiator::cacheable(d));
    REQUIRE(ranks.at[r].table().size() == 1);
    CHECK(ranks.at[r].table()[0].name == "b");
  }
  CHECK(stall_text(ranks.at[0].table()[0], ranks.at[0].joined()) ==
        "tensor 'b' was submitted by rank(s) 0, 1 but not by rank(s) 2");
  // Rank 0 warns after the warning time and asks for the shutdown after its own.
  Negotiator& r0 = ranks.at[0];
  CHECK_FALSE(r0.inspect_stalls(60, 0, t0 + std::chrono::seconds(100)));
  CHECK(r0.table()[0].warned);
  CHECK_FALSE(r0.inspect_stalls(60, 200, t0 + std::chrono::seconds(100)));
  CHECK(r0.inspect_stalls(60, 200, t0 + std::chrono::seconds(300)));
  CHECK_FALSE(r0.inspect_stalls(0, 200, t0 + std::chrono::seconds(300)));  // inspector off
  CHECK(r0.shutdown_reason(0, "").find(", while tensor 'b' was submitted by rank(s) 0, 1 but not "
                                       "by rank(s) 2") != std::string::npos);
  // Rank 2 submits it: decided everywhere, the table empty.
  ranks.flags();
  ranks.exchange({"", "", encode({{"b", allreduce(8)}})});
  for (std::size_t r = 0; r < 3; ++r) {
    REQUIRE(ranks.decided[r].size() == 1);
    CHECK(ranks.decided[r][0].name == "b");
    CHECK(ranks.at[r].table().empty());
  }
}

TEST_CASE("negotiator: a joined rank need not submit; a joined broadcast root is an error") {
  Ranks ranks(2);
  ranks.flags({false, true});
  RequestParams bc;
  bc.kind = OpKind::broadcast;
  bc.dtype = DataType::int32;
  bc.count = 3;
  bc.root = 1;
  ranks.exchange({encode({{"x", allreduce(2)}, {"bc", bc}}), ""});
  REQUIRE(ranks.decided[1].size() == 2);
  CHECK(ranks.decided[1][0].name == "x");
  CHECK(ranks.decided[1][0].error.empty());
  CHECK(ranks.decided[1][1].error ==
        "tensor 'bc': broadcast root 1 has joined and has no data to send");
  CHECK_FALSE(Negotiator::cacheable(ranks.decided[1][1]));
}

TEST_CASE("negotiator: parameters that differ become the same mismatch on every rank") {
  Ranks ranks(3);
  ranks.flags();
  RequestParams avg = allreduce(4, DataType::float32, ReduceOp::average);
  ranks.exchange(
      {encode({{"m", allreduce(4)}}), encode({{"m", allreduce(4)}}), encode({{"m", avg}})});
  for (std::size_t r = 0; r < 3; ++r) {
    REQUIRE(ranks.decided[r].size() == 1);
    CHECK(ranks.decided[r][0].error ==
          "tensor 'm' mismatch: rank 0 submitted allreduce(4 x float32, sum) but rank 2 submitted "
          "allreduce(4 x float32, average)");
    CHECK(ranks.decided[r][0].error_tensor == -1);
  }
  // A coalesced list: the first tensor whose count differs is named.
  RequestParams a = allreduce(6), b = allreduce(6);
  a.parts = {1, 2, 3};
  b.parts = {1, 3, 2};
  ranks.flags();
  ranks.exchange({encode({{"c", a}}), encode({{"c", b}}), encode({{"c", a}})});
  const Decided& d = ranks.decided[0][0];
  CHECK(d.error_tensor == 1);
  CHECK(d.error ==
        "tensor 'c' mismatch: rank 0's tensor 1 has 2 elements but rank 1's has 3 (coalesced "
        "submissions: every rank passes the same tensor counts, in the same order)");
}

TEST_CASE("negotiator: allgather counts may differ and are never cached") {
  Ranks ranks(3);
  ranks.flags({false, false, true});
  RequestParams g;
  g.kind = OpKind::allgather;
  g.dtype = DataType::float64;
  std::vector<std::string> mine;
  for (std::uint64_t c : {2u, 5u}) {
    g.count = c;
    mine.push_back(encode({{"g", g}}));
  }
  mine.push_back("");  // joined
  ranks.exchange(mine);
  const Decided& d = ranks.decided[2][0];
  CHECK(d.error.empty());
  CHECK(d.counts == std::vector<std::size_t>{2, 5, 0});
  CHECK_FALSE(Negotiator::cacheable(d));
}

TEST_CASE("negotiator: the request wire format round-trips and rejects truncation") {
  RequestParams p = allreduce(1u << 20, DataType::float32, ReduceOp::max);
  p.prescale = 0.5;
  p.postscale = 2;
  p.group = "grp";
  p.group_size = 3;
  p.device = 1;
  p.parts = {7, 9};
  p.join_average = kolo::JoinAverage::active_ranks;
  const std::string wire = encode({{"name", p}, {"", allreduce(0)}});
  const auto back = kolo::deserialize_requests(wire);
  REQUIRE(back.size() == 2);
  CHECK(back[0].name == "name");
  CHECK(back[0].p == p);
  CHECK(back[1].name.empty());
  CHECK(back[1].p == allreduce(0));
  Negotiator n(0, 1);
  std::vector<FlagsIn> in(1);
  n.flags(in[0]);
  n.read_flags();
  for (std::size_t cut : {std::size_t{1}, std::size_t{5}, wire.size() - 1}) {
    CHECK_THROWS_WITH_AS(n.file(wire.substr(0, cut), {cut}, kolo::detail::engine::clock::now()),
                         "engine: truncated negotiation message", kolo::Error);
  }
}

TEST_CASE("negotiator: one rank through the Exchange interface") {
  Negotiator n(0, 1);
  LoopbackExchange ex;
  FlagsIn in;
  in.has_new = true;
  ex.min(n.flags(in));
  n.read_flags();
  CHECK(n.new_names());
  std::deque<Decided> out;
  n.exchange(ex, encode({{"solo", allreduce(3)}}), out);
  CHECK(ex.mins == 1);
  CHECK(ex.gathers == 1);
  REQUIRE(out.size() == 1);
  CHECK(out[0].name == "solo");
  CHECK(out[0].p.count == 3);
}
