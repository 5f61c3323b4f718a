// allreduce_demo — the README's first command: N processes on this host sum a vector.
//
//   kolo-run -np 4 ./allreduce_demo [elements]
//
// Each rank fills its vector with (rank + 1), allreduces with sum, and checks that every
// element equals 1 + 2 + ... + N = N(N+1)/2. Then it averages, and times a few rounds.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <kolo/kolo.hpp>

int main(int argc, char** argv) {
  try {
    const std::size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (1u << 20);
    auto comm = kolo::Communicator<>::from_env();
    const int rank = comm.rank();
    const int size = comm.size();

    std::vector<float> data(n, static_cast<float>(rank + 1));
    comm.allreduce(std::span<float>(data), kolo::ReduceOp::sum);
    const float expect = static_cast<float>(size) * static_cast<float>(size + 1) / 2.0f;
    std::size_t wrong = 0;
    for (float v : data) wrong += v != expect;

    std::vector<double> avg(n, static_cast<double>(rank));
    comm.allreduce(std::span<double>(avg), kolo::ReduceOp::average);
    const double expect_avg = static_cast<double>(size - 1) / 2.0;
    for (double v : avg) wrong += v != expect_avg;

    const int rounds = 10;
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) comm.allreduce(std::span<float>(data), kolo::ReduceOp::max);
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
        rounds;

    std::printf(
        "rank %d/%d (local %d/%d, host %d/%d): sum of %zu floats = %g (expected %g), "
        "average = %g, %s; allreduce %.1f us, %.2f GB/s algbw\n",
        rank, size, comm.local_rank(), comm.local_size(), comm.cross_rank(), comm.cross_size(), n,
        n ? static_cast<double>(data[0]) : 0.0, static_cast<double>(expect), n ? avg[0] : 0.0,
        wrong ? "WRONG" : "correct", us, static_cast<double>(n * sizeof(float)) / us / 1e3);
    return wrong ? 1 : 0;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "allreduce_demo: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
}
