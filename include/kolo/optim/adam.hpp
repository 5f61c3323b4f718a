// kolo/optim/adam.hpp — Adam (Kingma & Ba 2015): a reference Optimizer.
//
// PyTorch's torch.optim.Adam (L2 weight decay added to the gradient, not AdamW):
//   g = grad + weight_decay · value
//   m = β1 · m + (1 - β1) · g          v = β2 · v + (1 - β2) · g²
//   value -= lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε)
// State: m and v per parameter and the step counter t (one for the optimizer: every parameter
// steps together under DistributedOptimizer, whose missing gradients are zeros).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/optim/parameter.hpp"

namespace kolo {

class Adam {
 public:
  struct Options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.0;
  };

  Adam() = default;
  explicit Adam(Options o) : opts_(o) {}

  Options& options() { return opts_; }
  const Options& options() const { return opts_; }
  std::int64_t steps() const { return t_; }

  void step(std::span<Parameter> params) {
    ++t_;
    const double bc1 = 1.0 - std::pow(opts_.beta1, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(opts_.beta2, static_cast<double>(t_));
    const float step_size = static_cast<float>(opts_.lr / bc1);
    const float inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
    const float b1 = static_cast<float>(opts_.beta1), b2 = static_cast<float>(opts_.beta2);
    const float eps = static_cast<float>(opts_.eps);
    const float wd = static_cast<float>(opts_.weight_decay);
    for (Parameter& p : params) {
      if (p.grad.size() != p.value.size()) {
        throw ConfigError("Adam: parameter '" + p.name + "' has " + std::to_string(p.value.size()) +
                          " values but " + std::to_string(p.grad.size()) + " gradients");
      }
      Moments& s = moments(p.name, p.value.size());
      for (std::size_t i = 0; i < p.value.size(); ++i) {
        const float g = p.grad[i] + wd * p.value[i];
        s.m[i] = b1 * s.m[i] + (1.0f - b1) * g;
        s.v[i] = b2 * s.v[i] + (1.0f - b2) * g * g;
        p.value[i] -= step_size * s.m[i] / (std::sqrt(s.v[i]) * inv_sqrt_bc2 + eps);
      }
    }
  }

  std::vector<StateTensor> state(std::span<const Parameter> params) {
    std::vector<StateTensor> out;
    out.push_back({"adam.step", TensorView(&t_, 1, DataType::int64)});
    for (const Parameter& p : params) {
      Moments& s = moments(p.name, p.value.size());
      out.push_back({"adam.m/" + p.name, TensorView(std::span<float>(s.m))});
      out.push_back({"adam.v/" + p.name, TensorView(std::span<float>(s.v))});
    }
    return out;
  }

 private:
  struct Moments {
    std::vector<float> m, v;
  };
  Moments& moments(const std::string& name, std::size_t n) {
    Moments& s = state_[name];
    if (s.m.empty() && n > 0) {
      s.m.assign(n, 0.0f);
      s.v.assign(n, 0.0f);
    }
    if (s.m.size() != n) {
      throw ConfigError("Adam: parameter '" + name + "' changed size from " +
                        std::to_string(s.m.size()) + " to " + std::to_string(n));
    }
    return s;
  }

  Options opts_;
  std::int64_t t_ = 0;
  std::unordered_map<std::string, Moments> state_;  // node-based: state() views stay valid
};

static_assert(StatefulOptimizer<Adam>);

}  // namespace kolo
