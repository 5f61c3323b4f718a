// exact_ops.hpp — the exact random collective steps the survive-a-loss workers run
// (elastic_worker.cpp, grow_worker.cpp): a step is an int64 allreduce (sum) or an int32
// allgather of 1..64K elements whose values are a function of (rank, index, step), checked
// element by element on every rank; and their one-line output (one write(2) per line, so lines of
// ranks sharing a pipe never interleave).
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>

namespace kolo_exact {

// This process's name in its lines ("rank=<label>"): the launcher's rank until it has a new one.
inline std::string& label() {
  static std::string l = [] {
    const char* r = std::getenv("KOLO_RANK");
    return std::string(r ? r : "?");
  }();
  return l;
}

inline void say(const std::string& line) {
  const std::string s = line + "\n";
  [[maybe_unused]] const ssize_t k = ::write(STDOUT_FILENO, s.data(), s.size());
}

// CLOCK_MONOTONIC seconds, comparable with the test driver's.
inline double mono_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// "KOLO_FAULT rank=R kind=K after=0 mono=T what=W" for an error not recovered; returns 3.
inline int report(const kolo::Error& e) {
  std::string what = e.what();
  for (char& c : what) {
    if (c == '\n') c = ' ';
  }
  char t[64];
  std::snprintf(t, sizeof(t), "0 mono=%.6f", mono_now());
  say("KOLO_FAULT rank=" + label() + " kind=" + kolo::error_kind_name(e.kind()) + " after=" + t +
      " what=" + what);
  return 3;
}

inline std::int64_t value(int rank, std::size_t i, long step) {
  return static_cast<std::int64_t>(rank) * 100003 + static_cast<std::int64_t>(i % 9973) + step;
}

// One random exact step on c (gen: the same sequence on every rank); false (after a KOLO_WRONG
// line) on a wrong number.
template <class Comm>
bool step(Comm& c, std::mt19937_64& gen, long it) {
  const std::size_t n = 1 + gen() % 65536;
  const int N = c.size(), r = c.rank();
  if (gen() % 2 == 0) {
    std::vector<std::int64_t> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value(r, i, it);
    c.allreduce(std::span<std::int64_t>(v));
    for (std::size_t i = 0; i < n; ++i) {
      std::int64_t want = 0;
      for (int q = 0; q < N; ++q) want += value(q, i, it);
      if (v[i] != want) {
        say("KOLO_WRONG rank=" + label() + " allreduce step " + std::to_string(it) + " index " +
            std::to_string(i) + ": " + std::to_string(v[i]) + " != " + std::to_string(want));
        return false;
      }
    }
  } else {
    std::vector<std::int32_t> in(n), out(n * static_cast<std::size_t>(N), -1);
    for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<std::int32_t>(value(r, i, it));
    c.allgather(kolo::TensorView(std::span<std::int32_t>(in)),
                kolo::TensorView(std::span<std::int32_t>(out)));
    for (int q = 0; q < N; ++q) {
      for (std::size_t i = 0; i < n; ++i) {
        const auto want = static_cast<std::int32_t>(value(q, i, it));
        if (out[static_cast<std::size_t>(q) * n + i] != want) {
          say("KOLO_WRONG rank=" + label() + " allgather step " + std::to_string(it));
          return false;
        }
      }
    }
  }
  return true;
}

}  // namespace kolo_exact
