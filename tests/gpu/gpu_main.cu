// gpu_main.cu — doctest main of the GPU tests: skips (exit 77, CTest's SKIP_RETURN_CODE) with a
// message where no CUDA device can be used, so the tests build and "pass as skipped" on machines
// without a GPU (CI), and run everywhere else. The skip is tests/common/skip.hpp's reason no-gpu
// (allowed in CI; with KOLO_TEST_REQUIRE_GPU=1, on a GPU machine, a failure).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "../common/skip.hpp"
#include "../doctest_ran_nothing.hpp"

int main(int argc, char** argv) {
  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    return kolo_test::skip_exit_code(
        "no-gpu",
        std::string("no CUDA device (") +
            (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount reported 0 devices") +
            ")");
  }
  doctest::Context context(argc, argv);
  return kolo_test::ran_nothing_exit_code(context.run(), argv[0]);
}
