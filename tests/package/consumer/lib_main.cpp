// A program on the compiled core (kolo::kolo_lib or kolo::kolo_lib_shared): it must see
// KOLO_COMPILED_CORE from the target, so that Communicator<> and Engine<> come from the library,
// and its allreduce, broadcast and Engine allreduce must produce the right numbers. One rank
// when started alone; under a launcher (KOLO_SIZE set), every rank it starts.
#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#if !KOLO_USE_COMPILED_CORE
#error "a target linking kolo::kolo_lib must get KOLO_COMPILED_CORE from it"
#endif

#ifndef KOLO_CONSUMER_MODE
#define KOLO_CONSUMER_MODE "unknown"
#endif
// link_name.cpp of the program: kolo_lib or kolo_lib_shared (this file compiles once for both).
extern const char* const kolo_consumer_link;

int main() {
  auto comm = std::getenv("KOLO_SIZE") != nullptr
                  ? kolo::Communicator<>::from_env()
                  : kolo::Communicator<>(kolo::Topology::for_rank(0, 1));
  const int n = comm.size(), r = comm.rank();
  int bad = 0;
  std::vector<float> grad(1 << 16, static_cast<float>(r + 1));
  comm.allreduce(std::span<float>(grad), kolo::ReduceOp::sum);
  for (float v : grad) bad += v != static_cast<float>(n * (n + 1) / 2);
  std::vector<std::int64_t> b(9, r == 0 ? 1000 : -1);
  comm.broadcast(std::span<std::int64_t>(b), 0);
  for (std::int64_t v : b) bad += v != 1000;

  kolo::Engine<> engine(std::move(comm));
  std::vector<double> e(100, 1.0);
  auto h =
      engine.allreduce_async("w", kolo::TensorView(std::span<double>(e)), kolo::ReduceOp::average);
  h.wait();
  for (double v : e) bad += v != 1.0;
  engine.shutdown();

  if (bad != 0) {
    std::fprintf(stderr, "kolo lib consumer: %d wrong values\n", bad);
    return 1;
  }
  std::printf("kolo lib consumer (%s, %s): rank %d/%d ok, sum %g\n", KOLO_CONSUMER_MODE,
              kolo_consumer_link, r, n, static_cast<double>(grad[0]));
  return 0;
}
