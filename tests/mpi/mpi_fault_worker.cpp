// A rank of an MPI job that misbehaves on purpose (run by tests/mpi through
// tests/common/run_expect.cmake):
//
//   mpi_fault_worker <p2p|native> <case>
//
// Every rank builds a kolo communicator on MPI_COMM_WORLD (kolo initialises MPI) and runs two
// good allreduces; then rank 1 does <case> while the others enter a third allreduce:
//   exit1   std::exit(1)                    -> the others: PeerLostError naming rank 1
//   exit0   std::exit(0): MPI_Finalize runs -> the same (the goodbye comes from MPI_Finalize)
//   abort   std::abort()                    -> mpirun ends the job (signal 6)
//   throw   an exception escapes main       -> std::terminate, the same
//   config  bad arguments (ConfigError)     -> every rank: ConfigError [reported by rank 1]
//   ok      nothing: all ranks succeed, exit 0 and MPI is finalized by kolo
// Each surviving rank prints "rank R caught <ErrorClass>: <message>" and exits 2 (config: after
// a barrier, so that mpirun cannot end the job before every rank has printed).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <kolo/communicator.hpp>
#include <kolo/transport/mpi.hpp>

namespace {

template <class T>
int run(const std::string& which) {
  kolo::Communicator<T> c(std::make_unique<T>(MPI_COMM_WORLD));
  const int r = c.rank();
  std::vector<float> in(4096, 1.0f), out(4096);
  // The error may reach a rank still in the warm-up: with MPI's own (native) collectives rank 1
  // can finish the second allreduce, and fail the next, before the others finish the second.
  try {
    for (int i = 0; i < 2; ++i) {
      c.allreduce(kolo::TensorView(in.data(), in.size(), kolo::DataType::float32),
                  kolo::TensorView(out.data(), out.size(), kolo::DataType::float32));
      if (out[0] != static_cast<float>(c.size())) {
        std::printf("rank %d: wrong result %g\n", r, static_cast<double>(out[0]));
        return 3;
      }
    }
    std::fflush(stdout);
    std::size_t out_count = out.size();
    if (r == 1) {
      if (which == "exit1") std::exit(1);
      if (which == "exit0") std::exit(0);
      if (which == "abort") std::abort();
      if (which == "throw") throw std::runtime_error("injected failure on rank 1");
      if (which == "config") out_count = 7;
    }
    c.allreduce(kolo::TensorView(in.data(), in.size(), kolo::DataType::float32),
                kolo::TensorView(out.data(), out_count, kolo::DataType::float32));
  } catch (const kolo::Error& e) {
    std::printf("rank %d caught %s: %s\n", r, kolo::error_kind_name(e.kind()), e.what());
    std::fflush(stdout);
    // config: every rank reports. mpirun ends the whole job as soon as one rank exits non-zero,
    // so a rank that exited first could cut a slower one short before its line (seen 2 in 20
    // runs); the test demands every rank's line, so they leave together (MPI_COMM_WORLD is
    // intact: kolo works on a duplicate).
    if (which == "config") MPI_Barrier(MPI_COMM_WORLD);
    return 2;
  }
  std::printf("rank %d done\n", r);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s <p2p|native> <exit1|exit0|abort|throw|config|ok>\n", argv[0]);
    return 64;
  }
  const std::string policy = argv[1], which = argv[2];
  try {
    return policy == "native" ? run<kolo::MpiNativeTransport>(which)
                              : run<kolo::MpiTransport>(which);
  } catch (const kolo::Error& e) {
    std::printf("setup failed: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 4;
  }
}
