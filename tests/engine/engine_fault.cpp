// engine_fault — a rank dies while the others wait on engine handles: every pending handle on
// every survivor must fail with PeerLostError (not hang, not time out), with a message that names
// the survivor's pending tensors and suggests join(). Run under kolo-run with a long --grace; the
// victim is rank 1. Besides 16 single tensors, each step submits a coalesced list of 8 more
// (allreduce_coalesced_async): its one handle fails the same way.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

int main() {
  kolo::Engine<> engine(kolo::Communicator<>::from_env());
  const int r = engine.rank();
  std::vector<std::vector<float>> ts(16, std::vector<float>(1 << 16, 1.0f));
  std::vector<std::vector<float>> bucket(8, std::vector<float>(1000, 1.0f));
  std::vector<kolo::TensorView> bucket_views;
  for (auto& b : bucket) bucket_views.emplace_back(std::span<float>(b));
  // A few good steps first: the peer dies in steady state, with the cache warm.
  for (int step = 0; step < 3; ++step) {
    std::vector<kolo::Handle> hs;
    for (int i = 0; i < 16; ++i) {
      hs.push_back(engine.allreduce_async("t" + std::to_string(i),
                                          kolo::TensorView(std::span<float>(ts[i]))));
    }
    hs.push_back(engine.allreduce_coalesced_async("bucket", bucket_views));
    for (auto& h : hs) h.wait();
  }
  // Step 4: the survivors submit their 16 tensors; rank 1 never does, and dies while they are
  // pending. Every survivor's handle must fail with PeerLostError, and the message must name
  // the user's tensors (the first few and a count) and point to join().
  if (r == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<kolo::Handle> hs;
  int lost = 0, other = 0, named = 0;
  std::string sample;
  for (int i = 0; i < 16; ++i) {
    try {  // (the victim waits 2 s before dying: these are pending by then)
      hs.push_back(engine.allreduce_async("t" + std::to_string(i),
                                          kolo::TensorView(std::span<float>(ts[i]))));
    } catch (const kolo::Error& e) {
      std::printf("rank %d: submitting t%d failed: %s\n", r, i, e.what());
      ++other;
    }
  }
  try {
    hs.push_back(engine.allreduce_coalesced_async("bucket", bucket_views));
  } catch (const kolo::Error& e) {
    std::printf("rank %d: submitting the bucket failed: %s\n", r, e.what());
    ++other;
  }
  for (auto& h : hs) {
    try {
      h.wait();
      ++other;
    } catch (const kolo::PeerLostError& e) {
      ++lost;
      const std::string m = e.what();
      if (sample.empty()) sample = m;
      named += m.find(
                   "17 tensors pending on this rank ('t0', 't1', 't2' and 14 more; "
                   "allreduce(sum))") != std::string::npos &&
               m.find("Engine::join()") != std::string::npos;
    } catch (const kolo::Error& e) {
      std::printf("rank %d: unexpected %s: %s\n", r, kolo::error_kind_name(e.kind()), e.what());
      ++other;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Once the engine has seen the loss, a new submission fails at once with the same error.
  bool refused = false;
  try {
    engine.allreduce_async("after", kolo::TensorView(std::span<float>(ts[0])));
  } catch (const kolo::PeerLostError&) {
    refused = true;
  }
  const bool ok = lost == 17 && named == 17 && other == 0 && refused && s < 15;
  std::printf(
      "survivor rank %d: %d of 17 handles failed with PeerLostError, %d named the tensors, "
      "in %.2f s%s\n  %s\n",
      r, lost, named, s, ok ? " OK" : " WRONG", sample.c_str());
  return ok ? 0 : 1;
}
