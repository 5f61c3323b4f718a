// kolo/optim/parameter.hpp — what an optimizer sees: named float32 parameters with their
// gradients, and the two concepts an optimizer meets to be wrapped by DistributedOptimizer.
//
// The caller owns the memory; a Parameter only views it (the model's weight matrix and the
// buffer its backward pass writes the gradient into). Names identify a parameter across ranks
// (they become the engine's tensor names) and in the optimizer's state, so they must be unique
// and the same on every rank.
#pragma once

#include <concepts>
#include <span>
#include <string>
#include <vector>

#include "kolo/core/tensor.hpp"

namespace kolo {

struct Parameter {
  std::string name;
  std::span<float> value;  // the weights the optimizer updates
  std::span<float> grad;   // d loss / d value, same length; written by the backward pass
};

// One tensor of an optimizer's learned state (a momentum buffer, a step counter), by name.
struct StateTensor {
  std::string name;
  TensorView tensor;
};

// An optimizer: updates every parameter's value from its gradient, in place.
//   opt.step(params)
template <class O>
concept Optimizer = std::move_constructible<O> && requires(O& o, std::span<Parameter> ps) {
  o.step(ps);
};

// An optimizer whose state can be broadcast (DistributedOptimizer::broadcast_optimizer_state):
//   opt.state(params) -> std::vector<StateTensor>
// returns views of every state tensor for these parameters, allocating (zero-initialised) state
// that does not exist yet, in an order that depends only on the parameters (the same on every
// rank). The views stay valid until the optimizer is destroyed. Hyperparameters (learning rate,
// betas) are configuration, not state: build the optimizer identically on every rank.
template <class O>
concept StatefulOptimizer = Optimizer<O> && requires(O& o, std::span<const Parameter> ps) {
  { o.state(ps) } -> std::convertible_to<std::vector<StateTensor>>;
};

}  // namespace kolo
