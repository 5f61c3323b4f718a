// The Engine: three named tensors submitted separately (fused into one collective) and waited
// for, sum and average, checked exactly. Includes the engine's header before the umbrella one.
#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

#include <string>
#include <vector>

#include "checks.hpp"

namespace unity_check {

int engine(kolo::Engine<>& engine) {
  const int n = engine.size();
  const int me = engine.rank();
  int bad = 0;
  std::vector<std::vector<float>> t(3);
  for (std::size_t k = 0; k < t.size(); ++k) t[k].assign(100 + 50 * k, static_cast<float>(me + 1));
  for (int step = 0; step < 2; ++step) {
    const kolo::ReduceOp op = step == 0 ? kolo::ReduceOp::sum : kolo::ReduceOp::average;
    std::vector<kolo::Handle> hs;
    for (std::size_t k = 0; k < t.size(); ++k) {
      hs.push_back(engine.allreduce_async("unity/" + std::to_string(step) + "/" + std::to_string(k),
                                          kolo::TensorView(std::span<float>(t[k])), op));
    }
    for (auto& h : hs) h.wait();
  }
  // sum gives n(n+1)/2 everywhere; the average of that is n(n+1)/2 again (exact for n <= 8).
  const float want = static_cast<float>(n * (n + 1) / 2);
  bool ok = true;
  for (const auto& v : t) {
    for (float x : v) ok = ok && x == want;
  }
  bad += expect(ok, me, "engine allreduce sum then average");
  return bad;
}

}  // namespace unity_check
