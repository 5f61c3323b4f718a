// kolo::mpi from another project: kolo's algorithms over MPI, under mpiexec. Each rank adds
// rank + 1 to 1000 int32; every element must be size(size+1)/2 (3 on 2 ranks: "sum 3000").
#include <kolo/communicator.hpp>
#include <kolo/transport/mpi.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

int main() {
  try {
    kolo::Communicator<kolo::MpiTransport> comm(std::make_unique<kolo::MpiTransport>());
    std::vector<std::int32_t> v(1000, comm.rank() + 1);
    comm.allreduce(v, kolo::ReduceOp::sum);
    const std::int32_t expect = comm.size() * (comm.size() + 1) / 2;
    std::int64_t total = 0;
    for (const std::int32_t x : v) {
      if (x != expect) {
        std::fprintf(stderr, "kolo mpi consumer: FAILED: rank %d has %d, expected %d\n",
                     comm.rank(), x, expect);
        return 1;
      }
      total += x;
    }
    std::printf("kolo mpi consumer: rank %d/%d ok, sum %lld\n", comm.rank(), comm.size(),
                static_cast<long long>(total));
    return 0;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "kolo mpi consumer: FAILED: %s\n", e.what());
    return 1;
  }
}
