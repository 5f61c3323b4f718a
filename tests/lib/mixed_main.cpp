// lib/mixed: a program of two files, this one compiled against kolo::kolo_lib and
// mixed_header_only.cpp compiled header-only (KOLO_HEADER_ONLY), both creating communicators and
// reducing, the values checked exactly.
#include <cstdio>
#include <span>
#include <vector>

#include "kolo/kolo.hpp"

#if !KOLO_USE_COMPILED_CORE
#error "mixed_main.cpp must be compiled with KOLO_COMPILED_CORE (link kolo::kolo_lib)"
#endif

int header_only_half();

int main() {
  auto comm = kolo::Communicator<>::from_env();
  const int n = comm.size();
  const int r = comm.rank();
  // float16: the library's F16C kernel (or the scalar path on a CPU without it).
  std::vector<kolo::float16> h(100, kolo::float16(static_cast<float>(r + 1)));
  comm.allreduce(std::span<kolo::float16>(h), kolo::ReduceOp::sum);
  int bad = 0;
  for (kolo::float16 x : h) bad += static_cast<float>(x) != static_cast<float>(n * (n + 1) / 2);
  bad += header_only_half();
  std::printf("kolo_lib mixed rank %d/%d: %s\n", r, n, bad == 0 ? "ok" : "WRONG VALUES");
  return bad == 0 ? 0 : 1;
}
