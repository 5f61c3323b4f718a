// Unit tests of the engine's batch plan (engine/detail/batch_plan.hpp): responses in, the
// batches (members, bytes, kind) and each allreduce batch's path out; no transport.
#include <doctest/doctest.h>

#include <deque>
#include <string>
#include <vector>

#include "engine_unit_common.hpp"
#include "kolo/engine/detail/batch_plan.hpp"

namespace {

using namespace engine_unit;
using namespace kolo::detail::engine;

// Responses over parameters (and mismatch errors) the test keeps alive.
struct Cycle {
  std::deque<std::string> names;
  std::deque<Decided> decided;
  std::vector<Response> rs;
  Cycle& add(RequestParams p, const std::string& error = "") {
    Decided& d = decided.emplace_back();
    d.name = "t" + std::to_string(rs.size());
    d.p = std::move(p);
    d.error = error;
    Response r;
    r.name = &d.name;
    r.p = &d.p;
    r.decided = &d;
    rs.push_back(r);
    return *this;
  }
};

RequestParams other(OpKind k) {
  RequestParams p = allreduce(10);
  p.kind = k;
  p.root = 0;
  return p;
}

std::vector<std::vector<std::size_t>> members(const BatchPlan& plan) {
  std::vector<std::vector<std::size_t>> out;
  for (const Batch& b : plan.batches) {
    const auto m = plan.of(b);
    out.emplace_back(m.begin(), m.end());
  }
  return out;
}

}  // namespace

TEST_CASE("batch plan: allreduces of one dtype, op and scaling fuse; others run alone") {
  Cycle c;
  c.add(allreduce(100))                                      // 0
      .add(allreduce(200))                                   // 1
      .add(other(OpKind::allgather))                         // 2
      .add(allreduce(50, DataType::float64))                 // 3
      .add(allreduce(10), "tensor 't4' mismatch: ...")       // 4: an error, no collective
      .add(other(OpKind::broadcast))                         // 5
      .add(allreduce(300))                                   // 6
      .add(allreduce(7, DataType::float32, ReduceOp::max));  // 7
  BatchPlan plan;
  plan_batches(c.rs, 1 << 20, plan);
  CHECK(members(plan) == std::vector<std::vector<std::size_t>>{{0, 1, 6}, {2}, {3}, {5}, {7}});
  REQUIRE(plan.batches.size() == 5);
  CHECK(plan.batches[0].kind == OpKind::allreduce);
  CHECK(plan.batches[0].bytes == 600 * 4);
  CHECK(plan.batches[1].kind == OpKind::allgather);
  CHECK(plan.batches[2].bytes == 50 * 8);
  CHECK(plan.batches[3].kind == OpKind::broadcast);
  CHECK(plan.batches[4].bytes == 7 * 4);
  // Scaling separates batches too.
  Cycle s;
  RequestParams scaled = allreduce(4);
  scaled.prescale = 0.5;
  s.add(allreduce(4)).add(scaled).add(allreduce(4));
  plan_batches(s.rs, 1 << 20, plan);
  CHECK(members(plan) == std::vector<std::vector<std::size_t>>{{0, 2}, {1}});
}

TEST_CASE("batch plan: the fusion threshold bounds a batch; the first tensor always runs") {
  Cycle c;
  c.add(allreduce(100))
      .add(allreduce(150))
      .add(allreduce(100))
      .add(allreduce(500));  // 400, 600, 400, 2000 bytes
  BatchPlan plan;
  plan_batches(c.rs, 800, plan);
  // 0 takes 2 (400 + 400), skipping 1 (400 + 600 > 800); 1 alone; 3 alone over the threshold.
  CHECK(members(plan) == std::vector<std::vector<std::size_t>>{{0, 2}, {1}, {3}});
  CHECK(plan.batches[0].bytes == 800);
  CHECK(plan.batches[2].bytes == 2000);
  plan_batches(c.rs, 0, plan);  // threshold 0: no fusion
  CHECK(members(plan) == std::vector<std::vector<std::size_t>>{{0}, {1}, {2}, {3}});
  plan_batches({}, 800, plan);
  CHECK(plan.batches.empty());
}

TEST_CASE("batch plan: a group travels whole past the threshold") {
  Cycle c;
  RequestParams g = allreduce(1000);
  g.group = "grp";
  g.group_size = 3;
  c.add(g).add(allreduce(1000)).add(g).add(g);
  BatchPlan plan;
  plan_batches(c.rs, 100, plan);
  CHECK(members(plan) == std::vector<std::vector<std::size_t>>{{0, 2, 3}, {1}});
  CHECK(plan.batches[0].bytes == 12000);
}

TEST_CASE("batch plan: an allreduce batch's path") {
  PathInputs in{4, 4, false, true, true};  // 4 ranks, none joined, vectored, pieces on
  const RequestParams sum = allreduce(10);
  CHECK(allreduce_path(sum, 1, in) == Path::single);
  CHECK(allreduce_path(sum, 5, in) == Path::pieces);
  RequestParams avg = allreduce(10, DataType::float32, ReduceOp::average);
  CHECK(divisor_of(avg, in) == 4);
  CHECK(allreduce_path(avg, 5, in) == Path::pieces);
  // An average over the active ranks while one has joined: the fusion buffer divides.
  avg.join_average = kolo::JoinAverage::active_ranks;
  PathInputs joined = in;
  joined.active = 3;
  CHECK(divisor_of(avg, joined) == 3);
  CHECK_FALSE(in_pieces(avg, divisor_of(avg, joined), joined));
  CHECK(allreduce_path(avg, 5, joined) == Path::fused);
  CHECK(allreduce_path(sum, 5, joined) == Path::fused);  // a joined rank's zeros: packed
  RequestParams scaled = sum;
  scaled.postscale = 2;
  CHECK(allreduce_path(scaled, 5, in) == Path::fused);
  PathInputs flat = in;
  flat.vectored = false;
  CHECK(allreduce_path(sum, 5, flat) == Path::fused);
  flat = in;
  flat.fusion_pieces = false;
  CHECK(allreduce_path(sum, 5, flat) == Path::fused);
  // Compression: float32 sum/average only.
  PathInputs comp = in;
  comp.compression = true;
  CHECK(allreduce_path(sum, 5, comp) == Path::compressed);
  CHECK(allreduce_path(allreduce(10, DataType::float64), 5, comp) == Path::pieces);
  CHECK(allreduce_path(allreduce(10, DataType::float32, ReduceOp::max), 1, comp) == Path::single);
  // Device tensors first, whatever else holds.
  RequestParams dev = sum;
  dev.device = 1;
  CHECK(allreduce_path(dev, 5, comp) == Path::device);
  // One rank: each output its own input, unless that path declined.
  PathInputs one{1, 1, false, true, true};
  CHECK(allreduce_path(sum, 5, one) == Path::alone);
  CHECK(allreduce_path(avg, 5, one) == Path::alone);  // divides by 1
  CHECK(allreduce_path(sum, 5, one, false) == Path::fused);
  CHECK(allreduce_path(sum, 1, one, false) == Path::single);
}
