// bench_impl_stubs.cpp — the factories of the implementations this build could not include:
// `--impl mpi|gloo|nccl` then fails with a message that says what was missing (exit status 3)
// instead of the binary failing to build.
#include "bench_impl.hpp"

namespace kolo::bench {

#ifndef KOLO_BENCH_HAVE_MPI
std::unique_ptr<Impl> make_kolo_mpi_impl(const KoloConfig&, bool) {
  throw Unavailable(
      "--transport mpi/mpi-native: this kolo-bench was built without MPI (find_package(MPI) "
      "found no C++ MPI; install libopenmpi-dev and reconfigure)");
}

std::unique_ptr<Impl> make_mpi_impl() {
  throw Unavailable(
      "--impl mpi: this kolo-bench was built without MPI (find_package(MPI) found no C++ MPI; "
      "install libopenmpi-dev and reconfigure)");
}
#endif

#ifndef KOLO_BENCH_HAVE_GLOO
std::unique_ptr<Impl> make_gloo_impl(bool) {
  throw Unavailable(
      "--impl gloo: this kolo-bench was built without Gloo (find_package(Gloo) failed; install "
      "libgloo-dev and reconfigure)");
}
#endif

#ifndef KOLO_BENCH_HAVE_NCCL
std::unique_ptr<Impl> make_nccl_impl() {
  throw Unavailable(
      "--impl nccl: this kolo-bench was built without NCCL (it needs the CUDA toolkit and "
      "nccl.h/libnccl at configure time, and a GPU at run time)");
}
#endif

}  // namespace kolo::bench
