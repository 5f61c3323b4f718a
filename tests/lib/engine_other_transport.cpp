// lib/engine_other_transport: a file compiled against kolo::kolo_lib (KOLO_COMPILED_CORE) that
// builds an Engine of a transport the library does not hold (InprocTransport: two ranks as
// threads of this process). It includes <kolo/engine/engine_impl.hpp>, as the compiled core's
// documentation says, and reduces through the engine: an allreduce, an allgather and a
// broadcast, each value checked exactly. Compiled without that include (-DKOLO_NO_ENGINE_IMPL),
// the file must fail with a message naming the header (lib/engine_needs_impl).
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kolo/engine/engine.hpp"
#ifndef KOLO_NO_ENGINE_IMPL
#include "kolo/engine/engine_impl.hpp"
#endif
#include "kolo/kolo.hpp"
#include "kolo/transport/inproc.hpp"

#if !KOLO_USE_COMPILED_CORE
#error "engine_other_transport.cpp must be compiled with KOLO_COMPILED_CORE (link kolo::kolo_lib)"
#endif

int main() {
  constexpr int n = 2;
  kolo::InprocFabric fabric(n, 60.0);
  std::vector<std::string> errors(n);
  std::vector<int> bad(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        kolo::CommunicatorOptions copts;
        kolo::Communicator<kolo::InprocTransport> comm(
            std::make_unique<kolo::InprocTransport>(fabric, r), copts);
        kolo::EngineOptions eopts;
        eopts.cycle_time_ms = 1.0;
        kolo::Engine<kolo::InprocTransport> engine(std::move(comm), eopts);
        auto& b = bad[static_cast<std::size_t>(r)];
        b += engine.rank() != r || engine.size() != n;

        std::vector<float> grad(1000, static_cast<float>(r + 1));
        std::vector<std::int64_t> mine(static_cast<std::size_t>(r + 1), 10 * (r + 1));
        std::vector<double> root(7, r == 1 ? 2.5 : 0.0);
        auto h1 = engine.allreduce_async("grad", grad, kolo::ReduceOp::sum);
        auto h2 = engine.allgather_async("mine", mine);
        auto h3 = engine.broadcast_async("root", root, 1);
        h1.wait();
        h2.wait();
        h3.wait();
        for (float v : grad) b += v != 3.0f;  // 1 + 2
        const kolo::TensorView out = h2.output();
        const std::vector<std::int64_t> want{10, 20, 20};
        b += out.count != want.size() || out.dtype != kolo::DataType::int64;
        for (std::size_t i = 0; i < want.size() && i < out.count; ++i) {
          b += static_cast<const std::int64_t*>(out.data)[i] != want[i];
        }
        for (double v : root) b += v != 2.5;
        b += engine.stats().cycles == 0;
        engine.shutdown();
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  int failed = 0;
  for (int r = 0; r < n; ++r) {
    const auto& e = errors[static_cast<std::size_t>(r)];
    if (!e.empty()) std::printf("rank %d threw: %s\n", r, e.c_str());
    failed += !e.empty() || bad[static_cast<std::size_t>(r)] != 0;
  }
  std::printf("engine of another transport with the compiled core: %s\n",
              failed == 0 ? "ok" : "WRONG VALUES");
  return failed == 0 ? 0 : 1;
}
