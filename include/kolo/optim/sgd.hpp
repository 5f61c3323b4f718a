// kolo/optim/sgd.hpp — stochastic gradient descent with momentum: a reference Optimizer.
//
// PyTorch's torch.optim.SGD without dampening, so that results compare one to one:
//   g   = grad + weight_decay · value
//   buf = momentum · buf + g            (buf starts at zero, so the first step is buf = g)
//   d   = nesterov ? g + momentum · buf : buf
//   value -= lr · d
// State: one momentum buffer per parameter (none when momentum is 0).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/optim/parameter.hpp"

namespace kolo {

class SGD {
 public:
  struct Options {
    double lr = 0.01;
    double momentum = 0.0;
    double weight_decay = 0.0;
    bool nesterov = false;
  };

  SGD() = default;
  explicit SGD(Options o) : opts_(o) {}

  Options& options() { return opts_; }  // e.g. a learning-rate schedule sets options().lr
  const Options& options() const { return opts_; }

  void step(std::span<Parameter> params) {
    const float lr = static_cast<float>(opts_.lr);
    const float mu = static_cast<float>(opts_.momentum);
    const float wd = static_cast<float>(opts_.weight_decay);
    for (Parameter& p : params) {
      check(p);
      float* buf = opts_.momentum != 0.0 ? buffer(p.name, p.value.size()).data() : nullptr;
      for (std::size_t i = 0; i < p.value.size(); ++i) {
        float g = p.grad[i] + wd * p.value[i];
        if (buf) {
          buf[i] = mu * buf[i] + g;
          g = opts_.nesterov ? g + mu * buf[i] : buf[i];
        }
        p.value[i] -= lr * g;
      }
    }
  }

  std::vector<StateTensor> state(std::span<const Parameter> params) {
    std::vector<StateTensor> out;
    if (opts_.momentum == 0.0) return out;
    for (const Parameter& p : params) {
      auto& b = buffer(p.name, p.value.size());
      out.push_back({"sgd.momentum/" + p.name, TensorView(std::span<float>(b))});
    }
    return out;
  }

 private:
  static void check(const Parameter& p) {
    if (p.grad.size() != p.value.size()) {
      throw ConfigError("SGD: parameter '" + p.name + "' has " + std::to_string(p.value.size()) +
                        " values but " + std::to_string(p.grad.size()) + " gradients");
    }
  }
  std::vector<float>& buffer(const std::string& name, std::size_t n) {
    auto& b = momentum_[name];
    if (b.empty()) b.assign(n, 0.0f);
    if (b.size() != n) {
      throw ConfigError("SGD: parameter '" + name + "' changed size from " +
                        std::to_string(b.size()) + " to " + std::to_string(n));
    }
    return b;
  }

  Options opts_;
  // Node-based: references to the buffers stay valid as parameters are added (state() views).
  std::unordered_map<std::string, std::vector<float>> momentum_;
};

static_assert(StatefulOptimizer<SGD>);

}  // namespace kolo
