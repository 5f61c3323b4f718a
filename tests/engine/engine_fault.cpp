// engine_fault — a rank dies while the others wait on engine handles: every pending handle on
// every survivor must fail with PeerLostError (not hang, not time out). Run under kolo-run with
// a long --grace; the victim is rank 1.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

int main() {
  kolo::Engine<> engine(kolo::Communicator<>::from_env());
  const int r = engine.rank();
  std::vector<std::vector<float>> ts(16, std::vector<float>(1 << 16, 1.0f));
  // A few good steps first: the peer dies in steady state, with the cache warm.
  for (int step = 0; step < 3; ++step) {
    std::vector<kolo::Handle> hs;
    for (int i = 0; i < 16; ++i) {
      hs.push_back(engine.allreduce_async("t" + std::to_string(i),
                                          kolo::TensorView(std::span<float>(ts[i]))));
    }
    for (auto& h : hs) h.wait();
  }
  if (r == 1) {
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<kolo::Handle> hs;
  int lost = 0, other = 0;
  for (int i = 0; i < 16; ++i) {
    try {  // once the engine has seen the loss, submitting fails at once with the same error
      hs.push_back(engine.allreduce_async("t" + std::to_string(i),
                                          kolo::TensorView(std::span<float>(ts[i]))));
    } catch (const kolo::PeerLostError&) {
      ++lost;
    }
  }
  for (auto& h : hs) {
    try {
      h.wait();
      ++other;
    } catch (const kolo::PeerLostError&) {
      ++lost;
    } catch (const kolo::Error& e) {
      std::printf("rank %d: unexpected %s: %s\n", r, kolo::error_kind_name(e.kind()), e.what());
      ++other;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("survivor rank %d: %d of 16 handles failed with PeerLostError in %.2f s%s\n", r, lost,
              s, lost == 16 && s < 10 ? " OK" : " WRONG");
  return lost == 16 ? 0 : 1;
}
