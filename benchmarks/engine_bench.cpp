// engine_bench — the engine's speed targets (docs/performance.md):
//   * 1024 tensors x 4 KiB through the engine vs one 4 MiB allreduce (target <= 1.3x)
//   * negotiation cost per cycle with the response cache vs without (KOLO_CACHE_CAPACITY=0)
//   * timeline on vs off
// Run: kolo-run -np N kolo-engine-bench [tensors] [bytes_per_tensor] [steps]
// Prints one JSON line per measurement on rank 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Result {
  double step_us;
  kolo::EngineStats stats;
};

Result run_engine(kolo::EngineOptions opts, std::size_t tensors, std::size_t bytes, int steps) {
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), opts);
  std::vector<std::vector<float>> ts(tensors, std::vector<float>(bytes / sizeof(float), 1.0f));
  std::vector<kolo::Handle> hs(tensors);
  auto step = [&] {
    for (std::size_t i = 0; i < tensors; ++i) {
      hs[i] = engine.allreduce_async("grad." + std::to_string(i),
                                     kolo::TensorView(std::span<float>(ts[i])));
    }
    for (auto& h : hs) h.wait();
  };
  for (int w = 0; w < 3; ++w) step();  // negotiate once, then steady state
  const auto before = engine.stats();
  const auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) step();
  const auto t1 = clock_type::now();
  auto after = engine.stats();
  after.cycles -= before.cycles;
  after.uncached_cycles -= before.uncached_cycles;
  after.negotiation_seconds -= before.negotiation_seconds;
  after.fused_collectives -= before.fused_collectives;
  return {seconds(t0, t1) / steps * 1e6, after};
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t tensors = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1024;
  const std::size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 4096;
  const int steps = argc > 3 ? std::atoi(argv[3]) : 20;
  try {
    // Baseline: one allreduce of the whole payload, blocking.
    double one_us;
    int rank, size;
    {
      auto comm = kolo::Communicator<>::from_env();
      rank = comm.rank();
      size = comm.size();
      std::vector<float> big(tensors * bytes / sizeof(float), 1.0f);
      for (int w = 0; w < 3; ++w) comm.allreduce(std::span<float>(big));
      const auto t0 = clock_type::now();
      for (int s = 0; s < steps; ++s) comm.allreduce(std::span<float>(big));
      one_us = seconds(t0, clock_type::now()) / steps * 1e6;
    }
    kolo::EngineOptions base = kolo::EngineOptions::from_env();
    base.timeline.clear();
    const Result cached = run_engine(base, tensors, bytes, steps);
    kolo::EngineOptions nocache = base;
    nocache.cache_capacity = 0;
    const Result uncached = run_engine(nocache, tensors, bytes, steps);
    kolo::EngineOptions tl = base;
    tl.timeline = "/tmp/kolo-engine-bench-timeline.json";
    const Result timed = run_engine(tl, tensors, bytes, steps);
    if (rank == 0) {
      const char* transport = std::getenv("KOLO_TRANSPORT");
      std::printf(
          "{\"bench\":\"engine_fusion\",\"ranks\":%d,\"transport\":\"%s\",\"tensors\":%zu,"
          "\"bytes_per_tensor\":%zu,\"one_allreduce_us\":%.1f,\"engine_step_us\":%.1f,"
          "\"ratio\":%.3f,\"target\":1.3}\n",
          size, transport ? transport : "routed", tensors, bytes, one_us, cached.step_us,
          cached.step_us / one_us);
      auto per_cycle = [](const Result& r) {
        return r.stats.cycles
                   ? r.stats.negotiation_seconds / static_cast<double>(r.stats.cycles) * 1e6
                   : 0.0;
      };
      std::printf(
          "{\"bench\":\"engine_negotiation\",\"ranks\":%d,\"cached_us_per_cycle\":%.1f,"
          "\"cached_cycles_per_step\":%.2f,\"uncached_us_per_cycle\":%.1f,"
          "\"uncached_cycles_per_step\":%.2f,\"uncached_step_us\":%.1f}\n",
          size, per_cycle(cached), static_cast<double>(cached.stats.cycles) / steps,
          per_cycle(uncached), static_cast<double>(uncached.stats.cycles) / steps,
          uncached.step_us);
      std::printf(
          "{\"bench\":\"engine_timeline\",\"ranks\":%d,\"off_step_us\":%.1f,\"on_step_us\":%.1f,"
          "\"overhead\":%.3f}\n",
          size, cached.step_us, timed.step_us, timed.step_us / cached.step_us - 1.0);
      std::remove("/tmp/kolo-engine-bench-timeline.json");
    }
    return 0;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "engine_bench: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
}
