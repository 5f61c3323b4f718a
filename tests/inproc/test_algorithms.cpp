// Every registered algorithm of every collective (taken from the registries, so a new one is
// tested by being registered) x ranks 1-9, 13, 16 x element counts 0, 1, 7, 1000, 1048579,
// forced through the Selector on threads over InprocTransport; results exact on every rank,
// and the forced algorithm is the one that ran. The allreduce part is split by rank count into
// several test cases (CTest entries) so that `ctest -j2` balances them.
#include "inproc_harness.hpp"

namespace {

using kolo::AllgatherAlgorithm;
using kolo::AllreduceAlgorithm;
using kolo::AlltoallAlgorithm;
using kolo::BroadcastAlgorithm;
using kolo::ReduceScatterAlgorithm;

void allreduce_on(std::initializer_list<int> ranks) {
  for (const auto& [a, name] : inproc::registered<AllreduceAlgorithm>()) {
    for (int n : ranks) {
      CAPTURE(name);
      CAPTURE(n);
      inproc::run_matrix(n, a, name, inproc::allreduce_cell);
      // Bit-identical float sums on every rank.
      std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
      inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
        c.selector().force(a);
        inproc::allreduce_bits(c, r, results);
      });
      inproc::check_same_bits(results, "allreduce/" + name + " on " + std::to_string(n));
    }
  }
}

template <class Algo, class Cell>
void every_algorithm(Cell cell) {
  for (const auto& [a, name] : inproc::registered<Algo>()) {
    for (int n : inproc::kRankCounts) {
      CAPTURE(name);
      CAPTURE(n);
      inproc::run_matrix(n, a, name, cell);
    }
  }
}

}  // namespace

TEST_CASE("allreduce: every registered algorithm on 1-5 ranks") {
  allreduce_on({1, 2, 3, 4, 5});
}
TEST_CASE("allreduce: every registered algorithm on 6-8 ranks") {
  allreduce_on({6, 7, 8});
}
TEST_CASE("allreduce: every registered algorithm on 9 and 13 ranks") {
  allreduce_on({9, 13});
}
TEST_CASE("allreduce: every registered algorithm on 16 ranks") {
  allreduce_on({16});
}

TEST_CASE("broadcast: every registered algorithm on every rank count") {
  every_algorithm<BroadcastAlgorithm>(inproc::broadcast_cell);
}
TEST_CASE("allgather: every registered algorithm on every rank count") {
  every_algorithm<AllgatherAlgorithm>(inproc::allgather_cell);
}
TEST_CASE("reduce_scatter: every registered algorithm on every rank count") {
  every_algorithm<ReduceScatterAlgorithm>(inproc::reduce_scatter_cell);
}
TEST_CASE("alltoall: every registered algorithm on every rank count") {
  every_algorithm<AlltoallAlgorithm>(inproc::alltoall_cell);
}

// The cost model's own choice (no override) for every collective, on counts up to 1000: the
// automatic path runs the same code as the forced one, but with the Selector deciding.
TEST_CASE("auto: the model's own choices for every collective and rank count") {
  for (int n : inproc::kRankCounts) {
    CAPTURE(n);
    inproc::Failures f;
    inproc::run_ranks(n, [&](inproc::Comm& c, int r) {
      for (std::size_t count :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
        inproc::allreduce_cell(c, r, count, f, "auto allreduce", std::nullopt);
        inproc::broadcast_cell(c, r, count, f, "auto broadcast", std::nullopt);
        inproc::allgather_cell(c, r, count, f, "auto allgather", std::nullopt);
        inproc::reduce_scatter_cell(c, r, count, f, "auto reduce_scatter", std::nullopt);
        inproc::alltoall_cell(c, r, count, f, "auto alltoall", std::nullopt);
      }
    });
    CHECK_MESSAGE(f.count() == 0, n, " ranks: ", f.text());
  }
}
