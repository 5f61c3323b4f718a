// bench_impl_kolo_mpi.cpp — `--impl kolo --transport mpi|mpi-native` under mpirun: kolo's
// Communicator over MpiTransport (kolo's algorithms on MPI point-to-point) or
// MpiNativeTransport (MPI's own collectives behind kolo's API). Built only with MPI.
#include <kolo/transport/mpi.hpp>

#include "bench_impl_kolo.hpp"

namespace kolo::bench {

std::unique_ptr<Impl> make_kolo_mpi_impl(const KoloConfig& cfg, bool native) {
  if (native) {
    return std::make_unique<KoloImpl<MpiNativeTransport>>(
        Communicator<MpiNativeTransport>(std::make_unique<MpiNativeTransport>(MPI_COMM_WORLD)), cfg,
        "MpiNativeTransport (MPI's collectives behind kolo's API)");
  }
  return std::make_unique<KoloImpl<MpiTransport>>(
      Communicator<MpiTransport>(std::make_unique<MpiTransport>(MPI_COMM_WORLD)), cfg,
      "MpiTransport (kolo's algorithms over MPI_Isend/MPI_Irecv)");
}

}  // namespace kolo::bench
