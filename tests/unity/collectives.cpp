// The Communicator's collectives, checked exactly (small integers in float32 are exact).
// Includes the umbrella header after the class header: the other files include theirs in
// another order, and a unity build merges them into one translation unit.
#include <kolo/communicator.hpp>
#include <kolo/kolo.hpp>

#include <span>
#include <vector>

#include "checks.hpp"

namespace unity_check {

int collectives(kolo::Communicator<>& comm) {
  const int n = comm.size();
  const int me = comm.rank();
  int bad = 0;
  // 1000 elements: the vector body of the reduction and its scalar tail both run.
  std::vector<float> x(1000);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(me + 1) * (i % 7);
  comm.allreduce(std::span<float>(x), kolo::ReduceOp::sum);
  const float ranks_sum = static_cast<float>(n * (n + 1) / 2);
  bool ok = true;
  for (std::size_t i = 0; i < x.size(); ++i) ok = ok && x[i] == ranks_sum * (i % 7);
  bad += expect(ok, me, "allreduce sum");

  std::vector<std::int32_t> m{me, -me, 7};
  comm.allreduce(std::span<std::int32_t>(m), kolo::ReduceOp::max);
  bad += expect(m[0] == n - 1 && m[1] == 0 && m[2] == 7, me, "allreduce max int32");

  std::vector<double> b(33, me == 0 ? 2.5 : -1.0);
  comm.broadcast(std::span<double>(b), 0);
  ok = true;
  for (double v : b) ok = ok && v == 2.5;
  bad += expect(ok, me, "broadcast from rank 0");

  std::vector<std::int64_t> mine{me * 10, me * 10 + 1};
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(n));
  comm.allgather(std::span<const std::int64_t>(mine), std::span<std::int64_t>(all));
  ok = true;
  for (int r = 0; r < n; ++r) {
    ok = ok && all[2 * static_cast<std::size_t>(r)] == r * 10 &&
         all[2 * static_cast<std::size_t>(r) + 1] == r * 10 + 1;
  }
  bad += expect(ok, me, "allgather");
  return bad;
}

}  // namespace unity_check
