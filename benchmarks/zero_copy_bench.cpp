// kolo-zero-copy-bench — the zero-copy allreduce (Communicator::allocate Buffers, read in place by
// the local peers) against the channel path, one allreduce and through the engine, with the
// machine's memcpy bandwidth M measured in the same run (docs/performance.md, "Zero-copy
// allreduce on Buffers").
//
//   kolo-run -np N kolo-zero-copy-bench [--bytes 64M] [-n 5] [-r 5]
//
// Each repeat times, in rotating order so that a busy machine weighs on all of them alike:
//   memcpy         one copy of the tensor on rank 0 while the others wait (M = bytes / time)
//   channels       Communicator::allreduce on plain memory (std::vector)
//   zero-copy      Communicator::allreduce on a Buffer from Communicator::allocate
//   engine         Engine::allreduce_async(...).wait() of one plain tensor
//   engine-buffer  the same on a Buffer of the engine's communicator
// Each figure is the mean of -n calls (after one warm-up), the slowest rank's. Printed: the
// median over the -r repeats and the worst repeat, busbw = 2(N-1)/N · bytes / time, and the
// zero-copy bound 2M/(3N-1) (M from the same repeat). Results are checked (exact small-integer
// sums); exit 1 on a wrong element, 2 on bad arguments.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

#include "size_arg.hpp"

namespace {

using clock_type = std::chrono::steady_clock;

using kolo::bench::parse_bytes;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 64u << 20;
  long iters = 5, repeats = 5;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto next = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--bytes") {
        bytes = parse_bytes(next());
      } else if (a == "-n") {
        iters = std::stol(next());
      } else if (a == "-r") {
        repeats = std::stol(next());
      } else {
        throw std::invalid_argument("unknown argument " + a);
      }
    }
    if (bytes < 4 || iters < 1 || repeats < 1) throw std::invalid_argument("bad value");
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "kolo-zero-copy-bench: %s\nUsage: kolo-zero-copy-bench [--bytes SIZE] [-n ITERS] "
                 "[-r REPEATS] (under kolo-run)\n",
                 e.what());
    return 2;
  }
  try {
    auto ref = kolo::Communicator<>::from_env();
    auto ecomm = kolo::Communicator<>::from_env();
    const int n = ref.size(), me = ref.rank();
    const std::size_t count = bytes / sizeof(float);
    auto zbuf = ref.allocate<float>(count);
    auto ebuf = ecomm.allocate<float>(count);  // before the engine owns the communicator
    kolo::Engine<> engine(std::move(ecomm));
    std::vector<float> plain(count), src(count, 1.0f), dst(count);
    long wrong = 0;
    auto fill = [&](std::span<float> v) {
      std::fill(v.begin(), v.end(), static_cast<float>(me + 1));
    };
    const float want = static_cast<float>(n * (n + 1) / 2);
    auto check = [&](std::span<const float> v) {
      if (v.front() != want || v[v.size() / 2] != want || v.back() != want) ++wrong;
    };
    struct Case {
      const char* name;
      std::function<void()> prepare, run, verify;
      std::vector<double> us;
    };
    std::vector<Case> cases;
    cases.push_back({"memcpy",
                     [] {},
                     [&] {
                       // Rank 0 alone, the others idle: kolo-bench --memcpy's M (one thread, quiet
                       // machine).
                       if (me == 0) std::memcpy(dst.data(), src.data(), count * 4);
                     },
                     [] {},
                     {}});
    cases.push_back({"channels",
                     [&] { fill(plain); },
                     [&] { ref.allreduce(plain); },
                     [&] { check(plain); },
                     {}});
    cases.push_back({"zero-copy",
                     [&] { fill(zbuf.span()); },
                     [&] { ref.allreduce(zbuf); },
                     [&] { check(zbuf.span()); },
                     {}});
    cases.push_back(
        {"engine",
         [&] { fill(plain); },
         [&] { engine.allreduce_async("plain", kolo::TensorView(std::span<float>(plain))).wait(); },
         [&] { check(plain); },
         {}});
    cases.push_back(
        {"engine-buffer",
         [&] { fill(ebuf.span()); },
         [&] { engine.allreduce_async("buffer", kolo::TensorView(ebuf.span())).wait(); },
         [&] { check(ebuf.span()); },
         {}});
    for (long r = 0; r < repeats; ++r) {
      for (std::size_t k = 0; k < cases.size(); ++k) {
        Case& c = cases[(k + static_cast<std::size_t>(r)) % cases.size()];
        c.prepare();
        c.run();  // warm-up (and the checked call)
        c.verify();
        ref.barrier();
        double total = 0;
        for (long i = 0; i < iters; ++i) {
          c.prepare();
          ref.barrier();
          const auto t0 = clock_type::now();
          c.run();
          total += std::chrono::duration<double, std::micro>(clock_type::now() - t0).count();
        }
        double us = total / static_cast<double>(iters);
        ref.allreduce(std::span<double>(&us, 1), kolo::ReduceOp::max);
        c.us.push_back(us);
      }
    }
    double w = static_cast<double>(wrong);
    ref.allreduce(std::span<double>(&w, 1), kolo::ReduceOp::sum);
    if (me == 0) {
      const double S = static_cast<double>(count * 4);
      std::printf(
          "# kolo-zero-copy-bench: %zu B float32 sum, %d ranks, %ld calls x %ld repeats "
          "(interleaved); Buffers shared: %s\n",
          count * 4, n, iters, repeats, zbuf.shared() ? "yes" : "no");
      std::printf("%-14s %12s %12s %14s %18s\n", "what", "median us", "worst us", "busbw GB/s",
                  "vs bound 2M/(3N-1)");
      for (const Case& c : cases) {
        const double med = median(c.us);
        const double worst = *std::max_element(c.us.begin(), c.us.end());
        if (std::string(c.name) == "memcpy") {
          std::printf("%-14s %12.1f %12.1f %14s %18s  M = %.2f GB/s\n", c.name, med, worst, "-",
                      "-", S / med / 1e3);
          continue;
        }
        std::vector<double> ratio;
        for (std::size_t r = 0; r < c.us.size(); ++r) {
          const double m = S / cases[0].us[r] / 1e3;  // GB/s, this repeat
          const double bound = 2 * m / (3.0 * n - 1);
          const double busbw = 2.0 * (n - 1) / n * S / c.us[r] / 1e3;
          ratio.push_back(busbw / bound);
        }
        std::printf("%-14s %12.1f %12.1f %14.2f %12.2fx (worst %.2fx)\n", c.name, med, worst,
                    2.0 * (n - 1) / n * S / med / 1e3, median(ratio),
                    *std::min_element(ratio.begin(), ratio.end()));
      }
      std::printf("# Out of bounds values : %.0f %s\n", w, w == 0 ? "OK" : "FAILED");
    }
    return w == 0 ? 0 : 1;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "kolo-zero-copy-bench: %s: %s\n", kolo::error_kind_name(e.kind()),
                 e.what());
    return 1;
  }
}
