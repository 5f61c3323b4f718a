// The checks of the unity-build / precompiled-header program (tests/unity/CMakeLists.txt). Each
// .cpp file of the program holds one, so that a unity build merges files that include kolo's
// headers in different orders and instantiate different parts of it.
#pragma once

#include <cstdio>

#include <kolo/communicator.hpp>
#include <kolo/engine/engine.hpp>

namespace unity_check {

// Counts a failed check and says which on stderr (every rank).
inline int expect(bool ok, int rank, const char* what) {
  if (!ok) std::fprintf(stderr, "unity check rank %d: WRONG VALUES: %s\n", rank, what);
  return ok ? 0 : 1;
}

// Allreduce (sum, max), broadcast and allgather on `comm`; returns the number of failed checks.
int collectives(kolo::Communicator<>& comm);
// Engine allreduces (sum, average) of several tensors, fused; returns the failed checks.
int engine(kolo::Engine<>& engine);

}  // namespace unity_check
