// A tiny multilayer perceptron for the optimizer tests: 4 inputs, a tanh hidden layer, 3 classes,
// softmax cross-entropy averaged over the batch. Batched layer-wise backpropagation reports each
// layer's gradients as soon as they are computed (output layer first), as a framework's autograd
// would, so that DistributedOptimizer overlaps their allreduce with the rest of the backward pass.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <kolo/optim/parameter.hpp>

namespace tiny {

constexpr std::size_t kIn = 4, kHidden = 16, kOut = 3;

// splitmix64: the same numbers on every rank and every platform.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) {  // [lo, hi)
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f;
  }
};

struct Data {
  std::vector<float> x;  // n × kIn
  std::vector<int> y;
  std::size_t size() const { return y.size(); }
};

// A labelled set that a small network can learn: the class is the argmax of a fixed nonlinear
// function of the inputs.
inline Data make_data(std::size_t n, std::uint64_t seed) {
  Rng rng{seed};
  Data d;
  d.x.resize(n * kIn);
  d.y.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    float* x = &d.x[i * kIn];
    for (std::size_t j = 0; j < kIn; ++j) x[j] = rng.uniform(-1.0f, 1.0f);
    const float s[kOut] = {x[0] + x[1] * x[2], x[3] - x[0] * x[0], 0.3f - x[1] + 0.5f * x[3]};
    d.y[i] = static_cast<int>(std::max_element(s, s + kOut) - s);
  }
  return d;
}

struct Model {
  std::vector<float> w1, b1, w2, b2;      // values
  std::vector<float> gw1, gb1, gw2, gb2;  // gradients

  explicit Model(std::uint64_t seed) {
    Rng rng{seed};
    auto init = [&](std::vector<float>& v, std::size_t n, float scale) {
      v.resize(n);
      for (auto& e : v) e = rng.uniform(-scale, scale);
    };
    init(w1, kHidden * kIn, 0.5f);
    init(b1, kHidden, 0.1f);
    init(w2, kOut * kHidden, 0.25f);
    init(b2, kOut, 0.1f);
    gw1.assign(w1.size(), 0.0f);
    gb1.assign(b1.size(), 0.0f);
    gw2.assign(w2.size(), 0.0f);
    gb2.assign(b2.size(), 0.0f);
  }
  Model(const Model&) = delete;  // Parameters view the vectors: keep them where they are
  Model& operator=(const Model&) = delete;

  // Indices 0..3, in the order backward() reports them: w2, b2, w1, b1.
  std::vector<kolo::Parameter> parameters() {
    return {{"w2", w2, gw2}, {"b2", b2, gb2}, {"w1", w1, gw1}, {"b1", b1, gb1}};
  }

  std::vector<float> flat() const {
    std::vector<float> v;
    for (const auto* p : {&w2, &b2, &w1, &b1}) v.insert(v.end(), p->begin(), p->end());
    return v;
  }

  // Mean cross-entropy over samples [first, first + n) of `d`.
  double loss(const Data& d, std::size_t first, std::size_t n) const {
    double total = 0;
    for (std::size_t i = first; i < first + n; ++i) {
      float h[kHidden], p[kOut];
      forward(&d.x[i * kIn], h, p);
      total -= std::log(std::max(static_cast<double>(p[d.y[i]]), 1e-30));
    }
    return n ? total / static_cast<double>(n) : 0.0;
  }

  // Writes the mean gradient over samples [first, first + n) into the grad vectors, calling
  // ready(i) for parameter i (parameters() order) as soon as its gradient is complete.
  void backward(const Data& d, std::size_t first, std::size_t n,
                const std::function<void(std::size_t)>& ready) {
    std::vector<float> h(n * kHidden), dz(n * kOut);
    const float inv = 1.0f / static_cast<float>(n);
    for (std::size_t s = 0; s < n; ++s) {
      float p[kOut];
      forward(&d.x[(first + s) * kIn], &h[s * kHidden], p);
      for (std::size_t o = 0; o < kOut; ++o) {
        dz[s * kOut + o] = (p[o] - (static_cast<int>(o) == d.y[first + s] ? 1.0f : 0.0f)) * inv;
      }
    }
    // Output layer.
    std::fill(gw2.begin(), gw2.end(), 0.0f);
    std::fill(gb2.begin(), gb2.end(), 0.0f);
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t o = 0; o < kOut; ++o) {
        const float g = dz[s * kOut + o];
        gb2[o] += g;
        for (std::size_t j = 0; j < kHidden; ++j) gw2[o * kHidden + j] += g * h[s * kHidden + j];
      }
    }
    ready(0);
    ready(1);
    // Hidden layer: back through w2 and tanh.
    std::fill(gw1.begin(), gw1.end(), 0.0f);
    std::fill(gb1.begin(), gb1.end(), 0.0f);
    for (std::size_t s = 0; s < n; ++s) {
      const float* x = &d.x[(first + s) * kIn];
      for (std::size_t j = 0; j < kHidden; ++j) {
        float g = 0;
        for (std::size_t o = 0; o < kOut; ++o) g += dz[s * kOut + o] * w2[o * kHidden + j];
        const float hj = h[s * kHidden + j];
        g *= 1.0f - hj * hj;
        gb1[j] += g;
        for (std::size_t i = 0; i < kIn; ++i) gw1[j * kIn + i] += g * x[i];
      }
    }
    ready(2);
    ready(3);
  }

 private:
  void forward(const float* x, float* h, float* p) const {
    for (std::size_t j = 0; j < kHidden; ++j) {
      float a = b1[j];
      for (std::size_t i = 0; i < kIn; ++i) a += w1[j * kIn + i] * x[i];
      h[j] = std::tanh(a);
    }
    float z[kOut], m = -1e30f;
    for (std::size_t o = 0; o < kOut; ++o) {
      z[o] = b2[o];
      for (std::size_t j = 0; j < kHidden; ++j) z[o] += w2[o * kHidden + j] * h[j];
      m = std::max(m, z[o]);
    }
    float sum = 0;
    for (std::size_t o = 0; o < kOut; ++o) sum += (p[o] = std::exp(z[o] - m));
    for (std::size_t o = 0; o < kOut; ++o) p[o] /= sum;
  }
};

}  // namespace tiny
