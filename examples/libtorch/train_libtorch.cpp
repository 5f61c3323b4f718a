// train_libtorch.cpp — a custom C++ training loop on a real framework: a libtorch (PyTorch's C++
// frontend) MLP trained data-parallel, with its gradients averaged by kolo's Engine.
//
//   kolo-run -np 2 build/examples/libtorch/train_libtorch [--steps 100] [--check]
//
// What a Horovod user writes in Python, in C++: every rank builds the model (here with a
// different seed, so the broadcast matters), rank 0's parameters are broadcast, and after each
// backward pass every gradient is submitted by name to the Engine (allreduce_async, average).
// The Engine negotiates which tensors are ready everywhere, fuses them into one buffer and runs
// one allreduce; the loop waits for the handles and steps the torch optimizer.
//
// --check verifies the result and exits 1 when it is wrong:
//  - every rank ends with bit-identical parameters (an allgather of all of them);
//  - rank 0 trains an undistributed copy on the whole batch from the same start: data parallelism
//    over equal shards averages the shards' mean gradients, which is the full batch's mean
//    gradient, so the two agree to float32 rounding (max |diff| <= 1e-5, documented in
//    docs/libtorch.md);
//  - the loss fell below half its first value.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

namespace {

struct Net : torch::nn::Module {
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
  Net() {
    l1 = register_module("l1", torch::nn::Linear(8, 64));
    l2 = register_module("l2", torch::nn::Linear(64, 64));
    l3 = register_module("l3", torch::nn::Linear(64, 1));
  }
  torch::Tensor forward(torch::Tensor x) {
    return l3->forward(torch::tanh(l2->forward(torch::tanh(l1->forward(x)))));
  }
};

kolo::TensorView view(const torch::Tensor& t) {
  return kolo::TensorView(t.data_ptr<float>(), static_cast<std::size_t>(t.numel()),
                          kolo::DataType::float32);
}

// One SGD step on (x, y); when engine is given, gradients are averaged across ranks first.
float step(Net& net, torch::optim::SGD& opt, const torch::Tensor& x, const torch::Tensor& y,
           kolo::Engine<>* engine) {
  opt.zero_grad();
  auto loss = torch::mse_loss(net.forward(x), y);
  loss.backward();
  if (engine != nullptr) {
    std::vector<kolo::Handle> handles;
    for (const auto& p : net.named_parameters()) {
      handles.push_back(
          engine->allreduce_async(p.key(), view(p.value().grad()), kolo::ReduceOp::average));
    }
    for (auto& h : handles) h.wait();
  }
  opt.step();
  return loss.item<float>();
}

torch::Tensor flat_params(Net& net) {
  std::vector<torch::Tensor> ps;
  for (const auto& p : net.parameters()) ps.push_back(p.detach().reshape({-1}));
  return torch::cat(ps).contiguous();
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 100;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--steps") == 0 && i + 1 < argc) {
      steps = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--check") == 0) {
      check = true;
    } else {
      std::fprintf(stderr, "usage: %s [--steps N] [--check]\n", argv[0]);
      return 2;
    }
  }
  torch::set_num_threads(1);
  kolo::Engine<> engine(kolo::Communicator<>::from_env());
  const int rank = engine.communicator().rank();
  const int size = engine.communicator().size();

  // The data: y = sin(0.3 x . w) + 0.1 noise, 240 rows, the same on every rank (seeded); each rank
  // trains on its own equal shard.
  constexpr int kRows = 240;  // divisible by 1..6 ranks
  torch::manual_seed(7);
  const auto x = torch::randn({kRows, 8});
  const auto y = torch::sin(0.3 * x.matmul(torch::randn({8, 1}))) + 0.1 * torch::randn({kRows, 1});
  if (kRows % size != 0) {
    std::fprintf(stderr, "rank %d: %d rows do not split evenly over %d ranks\n", rank, kRows, size);
    return 2;
  }
  const int shard = kRows / size;
  const auto xs = x.slice(0, rank * shard, (rank + 1) * shard);
  const auto ys = y.slice(0, rank * shard, (rank + 1) * shard);

  // A different initialisation per rank: rank 0's is broadcast, as Horovod's
  // broadcast_parameters does.
  torch::manual_seed(1000 + rank);
  Net net;
  {
    torch::NoGradGuard no_grad;
    std::vector<kolo::Handle> handles;
    for (const auto& p : net.named_parameters()) {
      handles.push_back(engine.broadcast_async("init/" + p.key(), view(p.value()), 0));
    }
    for (auto& h : handles) h.wait();
  }
  // The reference starts where the distributed model starts (after the broadcast).
  Net ref;
  {
    torch::NoGradGuard no_grad;
    auto src = net.parameters();
    auto dst = ref.parameters();
    for (std::size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
  }

  torch::optim::SGD opt(net.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  const auto t0 = std::chrono::steady_clock::now();
  float first = 0, last = 0;
  for (int s = 0; s < steps; ++s) {
    last = step(net, opt, xs, ys, &engine);
    if (s == 0) first = last;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("rank %d/%d: %d steps in %.3f s (%.2f ms/step), shard loss %.4f -> %.4f\n", rank,
              size, steps, secs, 1e3 * secs / steps, first, last);
  if (!check) return 0;

  bool ok = true;
  // Bit-identical parameters everywhere.
  const auto mine = flat_params(net);
  auto gathered = engine.allgather_async("check/params", view(mine));
  gathered.wait();
  const auto* all = static_cast<const float*>(gathered.output().data);
  for (int q = 0; q < size; ++q) {
    if (std::memcmp(all + static_cast<std::size_t>(q) * mine.numel(), mine.data_ptr<float>(),
                    static_cast<std::size_t>(mine.numel()) * sizeof(float)) != 0) {
      std::printf("rank %d: WRONG: rank %d's parameters differ\n", rank, q);
      ok = false;
    }
  }
  if (rank == 0) {
    torch::optim::SGD ref_opt(ref.parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    float ref_first = 0, ref_last = 0;
    for (int s = 0; s < steps; ++s) {
      ref_last = step(ref, ref_opt, x, y, nullptr);
      if (s == 0) ref_first = ref_last;
    }
    const double diff = (flat_params(ref) - mine).abs().max().item<double>();
    std::printf(
        "rank 0: max |distributed - single process| = %.3g (limit 1e-5); full-batch "
        "loss %.4f -> %.4f\n",
        diff, ref_first, ref_last);
    if (!(diff <= 1e-5)) {
      std::printf("rank 0: WRONG: the data-parallel model left the single-process one\n");
      ok = false;
    }
    if (!(ref_last < 0.5f * ref_first)) {
      std::printf("rank 0: WRONG: the loss did not halve\n");
      ok = false;
    }
  }
  engine.join();
  std::printf("rank %d: %s\n", rank, ok ? "correct" : "WRONG");
  return ok ? 0 : 1;
}
