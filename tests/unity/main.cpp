// A program built as a unity build (its files merged into one translation unit) with kolo's
// headers precompiled, header-only and on the compiled core (tests/unity/CMakeLists.txt): the
// collectives and the engine give exact values, and every rank says "ok" when every rank's are
// (each rank's line, so that the test sees a line from every rank).
#include <cstdio>
#include <span>
#include <utility>
#include <vector>

#include "checks.hpp"

int main() {
  auto comm = kolo::Communicator<>::from_env();
  const int n = comm.size();
  const int me = comm.rank();
  int bad = unity_check::collectives(comm);
  kolo::Engine<> engine(std::move(comm));
  bad += unity_check::engine(engine);
  // Every rank's verdict reaches rank 0 through the engine (its thread owns the communicator).
  std::vector<float> verdict{static_cast<float>(bad)};
  engine.allreduce_async("unity/verdict", kolo::TensorView(std::span<float>(verdict))).wait();
  std::printf("unity check rank %d/%d: %s\n", me, n, verdict[0] == 0.0f ? "ok" : "WRONG VALUES");
  return bad == 0 ? 0 : 1;
}
