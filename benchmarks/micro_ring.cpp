// micro_ring — the segmented ring pipeline (kolo::allreduce_ring) on the in-process transport:
// threads as ranks, zero-copy rendezvous messages (kolo/transport/inproc.hpp). What it measures is
// the algorithm's own cost and the effect of the segment size, without shared-memory slots or
// sockets in the way; compare with kolo-bench over shm/tcp to see what the transport adds.
//
// Counters (GB = 1e9, shown as G/s): algbw = size / time, busbw = algbw x 2(n-1)/n. Each benchmark
// checks its result once (exact small-integer sums); a wrong one or an error fails the benchmark
// and the process (micro_check.hpp: exit status 1).
#include <benchmark/benchmark.h>

#include <barrier>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include <kolo/algorithm/ring_allreduce.hpp>

#include <kolo/transport/inproc.hpp>

#include "micro_check.hpp"

namespace {

using kolo::InprocFabric;
using kolo::InprocTransport;

void BM_RingAllreduce(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const auto bytes = static_cast<std::size_t>(state.range(1));
  const auto segment = static_cast<std::size_t>(state.range(2));
  const std::size_t count = bytes / sizeof(float);

  InprocFabric fabric(n);
  std::vector<std::vector<float>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto& v = in[static_cast<std::size_t>(r)];
    v.resize(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i + 3 * r) % 7);
    out[static_cast<std::size_t>(r)].assign(count, 0.0f);
  }
  kolo::AlgoOptions opt;
  opt.sig.collective = kolo::Collective::allreduce;
  opt.sig.dtype = kolo::DataType::float32;
  opt.sig.count = count;
  opt.sig.seq = 1;
  opt.segment_bytes = segment;

  std::barrier sync(n);
  bool stop = false;  // written by rank 0 between barrier phases only
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  auto run_once = [&](int r, InprocTransport& t) {
    try {
      kolo::AlgoOptions o = opt;
      o.deadline = kolo::Deadline::after(60);
      kolo::allreduce_ring(t, in[static_cast<std::size_t>(r)].data(),
                           out[static_cast<std::size_t>(r)].data(), count, kolo::DataType::float32,
                           kolo::ReduceOp::sum, o);
    } catch (...) {
      // Every rank keeps arriving at the barriers; the aborted fabric fails the rest quickly.
      if (!errors[static_cast<std::size_t>(r)]) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> workers;
  for (int r = 1; r < n; ++r) {
    workers.emplace_back([&, r] {
      InprocTransport t(fabric, r);
      for (;;) {
        sync.arrive_and_wait();
        if (stop) return;
        run_once(r, t);
        sync.arrive_and_wait();
      }
    });
  }
  InprocTransport t0(fabric, 0);
  for (auto _ : state) {
    sync.arrive_and_wait();
    run_once(0, t0);
    sync.arrive_and_wait();
  }
  stop = true;
  sync.arrive_and_wait();
  for (auto& w : workers) w.join();

  for (const auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      micro_check::fail(state, ex.what());
      return;
    }
  }
  // Expected: sum over ranks of (i + 3r) % 7, exact in float.
  for (int r = 0; r < n; ++r) {
    const auto& v = out[static_cast<std::size_t>(r)];
    const std::string what = "ring allreduce at rank " + std::to_string(r);
    const bool ok =
        micro_check::check_bits(state, what.c_str(), v.data(), count, [&](std::size_t i) {
          float expect = 0;
          for (int q = 0; q < n; ++q) expect += static_cast<float>((i + 3 * q) % 7);
          return expect;
        });
    if (!ok) return;
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["algbw"] = benchmark::Counter(
      iters * static_cast<double>(bytes), benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["busbw"] =
      benchmark::Counter(iters * static_cast<double>(bytes) * 2.0 * (n - 1) / n,
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void ring_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"ranks", "bytes", "segment"});
  for (int n : {2, 4}) {
    for (long bytes : {4096L, 65536L, 1L << 20, 16L << 20}) {
      for (long seg : {64L << 10, 256L << 10, 1L << 20}) {
        if (seg > bytes && seg != (256L << 10)) continue;  // segments beyond the size repeat
        b->Args({n, bytes, seg});
      }
    }
  }
  b->UseRealTime();  // the work happens on several threads
}

BENCHMARK(BM_RingAllreduce)->Apply(ring_args);

}  // namespace

int main(int argc, char** argv) {
  return micro_check::run(argc, argv);
}
