// micro_check.hpp — result checks for the Google Benchmark micro-benchmarks (micro_*.cpp): a
// wrong result fails the benchmark (SkipWithError) and the process (exit status 1), and a run in
// which no benchmark matched the filter fails too, so that CTest's bench/micro/* can go red.
//
//   --inject-wrong   testing aid: every check first corrupts its first checked element, to prove
//                    the checks catch it (bench/micro/*/inject_wrong expects exit status 1).
#pragma once

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

namespace micro_check {

inline std::atomic<int> failures{0};
inline bool inject_wrong = false;

// Records a wrong result: the benchmark reports the error and the process will exit 1.
inline void fail(benchmark::State& state, const std::string& what) {
  failures.fetch_add(1);
  std::fprintf(stderr, "wrong result: %s\n", what.c_str());
  state.SkipWithError(("wrong result: " + what).c_str());
}

// With --inject-wrong, flips the low bit of the first byte of a result before it is checked.
inline void maybe_corrupt(void* p) {
  if (inject_wrong) static_cast<unsigned char*>(p)[0] ^= 1;
}

// Compares n elements bit for bit with expect(i); reports the first difference.
template <class T, class F>
bool check_bits(benchmark::State& state, const char* what, const T* got, std::size_t n, F expect) {
  maybe_corrupt(const_cast<T*>(got));
  for (std::size_t i = 0; i < n; ++i) {
    const T want = expect(i);
    if (std::memcmp(&got[i], &want, sizeof(T)) != 0) {
      fail(state, std::string(what) + ", element " + std::to_string(i));
      return false;
    }
  }
  return true;
}

// main() of every micro-benchmark: takes --inject-wrong, runs the benchmarks, and exits 1 when
// a check failed or when the filter matched no benchmark.
inline int run(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--inject-wrong") == 0) {
      inject_wrong = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (ran == 0) {
    std::fprintf(stderr, "%s: no benchmark matched the filter\n", argv[0]);
    return 1;
  }
  if (failures.load() != 0) {
    std::fprintf(stderr, "%s: %d benchmark(s) gave a wrong result\n", argv[0], failures.load());
    return 1;
  }
  return 0;
}

}  // namespace micro_check
