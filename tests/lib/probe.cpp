// Compiled against kolo::kolo_lib (KOLO_COMPILED_CORE), this file uses what a training program
// uses — Communicator<> and the typed communicators, their collectives, the Engine — and
// check_extern.cmake asserts on its object file that it compiled none of it: every member of
// Communicator<T> and Engine<T> for the standard transports is an undefined reference, to be
// resolved by libkolo.a / libkolo.so. Run under kolo-run it also checks values (lib/probe/*).
#include <cstdio>
#include <span>
#include <vector>

#include "kolo/engine/engine.hpp"
#include "kolo/kolo.hpp"

#if !KOLO_USE_COMPILED_CORE
#error "probe.cpp must be compiled with KOLO_COMPILED_CORE (link kolo::kolo_lib)"
#endif

int main() {
  auto comm = kolo::Communicator<>::from_env();
  const int n = comm.size(), r = comm.rank();
  int bad = 0;

  std::vector<float> grad(1000, static_cast<float>(r + 1));
  comm.allreduce(std::span<float>(grad), kolo::ReduceOp::sum);
  for (float v : grad) bad += v != static_cast<float>(n * (n + 1) / 2);

  std::vector<double> b(33, r == n - 1 ? 2.5 : 0.0);
  comm.broadcast(std::span<double>(b), n - 1);
  for (double v : b) bad += v != 2.5;

  kolo::Engine<> engine(std::move(comm));
  std::vector<std::int32_t> e(77, r);
  auto h = engine.allreduce_async("probe", kolo::TensorView(std::span<std::int32_t>(e)),
                                  kolo::ReduceOp::max);
  h.wait();
  for (std::int32_t v : e) bad += v != n - 1;
  engine.shutdown();

  // A typed communicator, compiled in the library too.
  kolo::Communicator<kolo::ShmTransport> shm(kolo::Topology::from_env());
  std::vector<std::int64_t> s(5, 1);
  shm.allreduce(std::span<std::int64_t>(s));
  for (std::int64_t v : s) bad += v != n;

  std::printf("kolo_lib probe rank %d/%d: %s\n", r, n, bad == 0 ? "ok" : "WRONG VALUES");
  return bad == 0 ? 0 : 1;
}
