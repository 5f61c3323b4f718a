// train_mlp — data-parallel training of a small multilayer perceptron with kolo's
// DistributedOptimizer, in plain C++ (no framework, no external library).
//
//   kolo-run -np 4 build/examples/train_mlp [--epochs 120] [--batch 16] [--lr 0.02]
//            [--optimizer sgd|adam] [--hidden 48] [--compression none|fp16|bf16]
//            [--checkpoint train_mlp.ckpt] [--min-accuracy 0] [--quiet]
//
// The data set is two interleaved spirals (the classic hard case for a small network),
// generated from a fixed seed: every rank generates the same 2000 training and 1000 test points,
// so nothing ships and nothing is sent. Each epoch shuffles the training set with the epoch
// number as the seed (the same permutation on every rank) and cuts it into global batches of
// size × batch samples; rank r trains on the r-th slice of each. The learning rate is the base
// rate times the number of ranks (Goyal et al. 2017: the global batch grew by that factor).
//
// Each layer's gradients are handed to the optimizer as soon as the backward pass has computed
// them (output layer first), so their allreduce overlaps the rest of the backward pass. Rank 0
// prints the training loss of every epoch (averaged over all ranks' samples), the test accuracy,
// the training speed, and writes the checkpoint; exit status 1 if the accuracy is below
// --min-accuracy.
//
// The same program runs under mpirun when built with KOLO_EXAMPLE_MPI (CMake target
// train_mlp_mpi, linking kolo::mpi): only the Communicator's transport changes, to MPI
// point-to-point (add --native-mpi for MPI's own collectives); the optimizer, the engine, the
// compression and the training loop are untouched.
//
//   mpirun -np 4 build/examples/train_mlp_mpi [--native-mpi] [options above]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numbers>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>
#include <kolo/optim/optim.hpp>
#if defined(KOLO_EXAMPLE_MPI)
#include <kolo/transport/mpi.hpp>
#endif

namespace {

// ---------------- deterministic data ----------------

// splitmix64: the same stream on every rank, compiler and platform (unlike std:: distributions).
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1p-53; }  // [0, 1)
};

struct Dataset {
  std::vector<float> x;  // n × 2
  std::vector<int> y;    // 0 or 1
  std::size_t size() const { return y.size(); }
};

// Two spirals of 1.75 turns each (radius 0.4 to 4), the second rotated by half a turn, with
// a little noise.
Dataset two_spirals(std::size_t per_class, std::uint64_t seed, double phase) {
  Rng rng{seed};
  Dataset d;
  for (std::size_t i = 0; i < per_class; ++i) {
    const double t = (static_cast<double>(i) + phase) / static_cast<double>(per_class);
    const double radius = 4.0 * (0.1 + 0.9 * t);  // inputs of order 1..4: tanh units bend
    for (int c = 0; c < 2; ++c) {
      const double angle = 1.75 * 2 * std::numbers::pi * t + c * std::numbers::pi;
      d.x.push_back(static_cast<float>(radius * std::cos(angle) + 0.1 * (rng.uniform() - 0.5)));
      d.x.push_back(static_cast<float>(radius * std::sin(angle) + 0.1 * (rng.uniform() - 0.5)));
      d.y.push_back(c);
    }
  }
  return d;
}

// ---------------- the model ----------------

// y = act(W x + b) for a batch, row-major: x is batch × in, y is batch × out.
struct Dense {
  std::size_t in, out;
  bool tanh_act;
  std::vector<float> w, b, gw, gb;
  std::vector<float> x, y;  // saved for the backward pass

  Dense(std::size_t i, std::size_t o, bool act, Rng& rng) : in(i), out(o), tanh_act(act) {
    const double limit = std::sqrt(6.0 / static_cast<double>(in + out));  // Glorot uniform
    w.resize(in * out);
    for (auto& e : w) e = static_cast<float>((2 * rng.uniform() - 1) * limit);
    b.assign(out, 0.0f);
    gw.assign(w.size(), 0.0f);
    gb.assign(out, 0.0f);
  }

  const std::vector<float>& forward(const float* xin, std::size_t batch) {
    x.assign(xin, xin + batch * in);
    y.resize(batch * out);
    for (std::size_t s = 0; s < batch; ++s) {
      const float* xs = &x[s * in];
      for (std::size_t o = 0; o < out; ++o) {
        const float* wo = &w[o * in];
        float a = b[o];
        for (std::size_t i = 0; i < in; ++i) a += wo[i] * xs[i];
        y[s * out + o] = tanh_act ? std::tanh(a) : a;
      }
    }
    return y;
  }

  // dy: d loss / d output (batch × out), overwritten with d loss / d pre-activation. Writes this
  // layer's gradients and returns d loss / d input.
  std::vector<float> backward(std::vector<float>& dy, std::size_t batch) {
    if (tanh_act) {
      for (std::size_t k = 0; k < dy.size(); ++k) dy[k] *= 1.0f - y[k] * y[k];
    }
    std::fill(gw.begin(), gw.end(), 0.0f);
    std::fill(gb.begin(), gb.end(), 0.0f);
    std::vector<float> dx(batch * in, 0.0f);
    for (std::size_t s = 0; s < batch; ++s) {
      const float* xs = &x[s * in];
      float* dxs = &dx[s * in];
      for (std::size_t o = 0; o < out; ++o) {
        const float g = dy[s * out + o];
        gb[o] += g;
        float* gwo = &gw[o * in];
        const float* wo = &w[o * in];
        for (std::size_t i = 0; i < in; ++i) {
          gwo[i] += g * xs[i];
          dxs[i] += g * wo[i];
        }
      }
    }
    return dx;
  }
};

struct Mlp {
  std::vector<Dense> layers;

  Mlp(std::size_t hidden, std::uint64_t seed) {
    Rng rng{seed};
    layers.emplace_back(2, hidden, true, rng);
    layers.emplace_back(hidden, hidden, true, rng);
    layers.emplace_back(hidden, 2, false, rng);
  }

  // Parameter 2·l is layer l's weight matrix, 2·l + 1 its bias.
  std::vector<kolo::Parameter> parameters() {
    std::vector<kolo::Parameter> ps;
    for (std::size_t l = 0; l < layers.size(); ++l) {
      ps.push_back({"layer" + std::to_string(l) + ".w", layers[l].w, layers[l].gw});
      ps.push_back({"layer" + std::to_string(l) + ".b", layers[l].b, layers[l].gb});
    }
    return ps;
  }

  const std::vector<float>& logits(const float* x, std::size_t batch) {
    const float* in = x;
    for (auto& l : layers) in = l.forward(in, batch).data();
    return layers.back().y;
  }

  // Mean softmax cross-entropy over the batch; its gradient, layer by layer from the top,
  // announcing each layer's parameters through ready(index) as soon as they are computed.
  template <class Ready>
  double train_batch(const float* x, const int* y, std::size_t batch, Ready&& ready) {
    const auto& z = logits(x, batch);
    std::vector<float> dy(batch * 2);
    double loss = 0;
    for (std::size_t s = 0; s < batch; ++s) {
      const float m = std::max(z[2 * s], z[2 * s + 1]);
      const float e0 = std::exp(z[2 * s] - m), e1 = std::exp(z[2 * s + 1] - m);
      const float p[2] = {e0 / (e0 + e1), e1 / (e0 + e1)};
      loss -= std::log(std::max(static_cast<double>(p[y[s]]), 1e-30));
      for (int c = 0; c < 2; ++c) {
        dy[2 * s + static_cast<std::size_t>(c)] =
            (p[c] - (c == y[s] ? 1.0f : 0.0f)) / static_cast<float>(batch);
      }
    }
    for (std::size_t l = layers.size(); l-- > 0;) {
      std::vector<float> dx = layers[l].backward(dy, batch);
      ready(2 * l);
      ready(2 * l + 1);
      dy = std::move(dx);
    }
    return loss / static_cast<double>(batch);
  }

  std::size_t correct(const Dataset& d, std::size_t first, std::size_t n) {
    if (n == 0) return 0;
    const auto& z = logits(&d.x[2 * first], n);
    std::size_t ok = 0;
    for (std::size_t s = 0; s < n; ++s) ok += (z[2 * s + 1] > z[2 * s] ? 1 : 0) == d.y[first + s];
    return ok;
  }
};

// ---------------- checkpoint ----------------

// "KOLOMLP1", u32 parameter count, then per parameter: u32 name length, name, u64 count, floats.
void write_checkpoint(const std::string& path, std::span<const kolo::Parameter> params) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) throw kolo::ConfigError("cannot write checkpoint " + tmp);
    f.write("KOLOMLP1", 8);
    const auto np = static_cast<std::uint32_t>(params.size());
    f.write(reinterpret_cast<const char*>(&np), sizeof np);
    for (const auto& p : params) {
      const auto len = static_cast<std::uint32_t>(p.name.size());
      const auto count = static_cast<std::uint64_t>(p.value.size());
      f.write(reinterpret_cast<const char*>(&len), sizeof len);
      f.write(p.name.data(), len);
      f.write(reinterpret_cast<const char*>(&count), sizeof count);
      f.write(reinterpret_cast<const char*>(p.value.data()),
              static_cast<std::streamsize>(count * sizeof(float)));
    }
    if (!f) throw kolo::Error("checkpoint: write to " + tmp + " failed");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {  // atomic: a reader never sees half a file
    throw kolo::Error("checkpoint: cannot rename " + tmp + " to " + path);
  }
}

// Reads the checkpoint back and compares it with the parameters, bit for bit.
bool checkpoint_matches(const std::string& path, std::span<const kolo::Parameter> params) {
  std::ifstream f(path, std::ios::binary);
  char magic[8];
  std::uint32_t np = 0;
  if (!f.read(magic, 8) || std::memcmp(magic, "KOLOMLP1", 8) != 0) return false;
  if (!f.read(reinterpret_cast<char*>(&np), sizeof np) || np != params.size()) return false;
  for (const auto& p : params) {
    std::uint32_t len = 0;
    std::uint64_t count = 0;
    f.read(reinterpret_cast<char*>(&len), sizeof len);
    std::string name(len, '\0');
    f.read(name.data(), len);
    f.read(reinterpret_cast<char*>(&count), sizeof count);
    if (!f || name != p.name || count != p.value.size()) return false;
    std::vector<float> v(count);
    f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(count * sizeof(float)));
    if (!f || std::memcmp(v.data(), p.value.data(), count * sizeof(float)) != 0) return false;
  }
  return true;
}

// ---------------- the training loop ----------------

struct Args {
  int epochs = 120;
  std::size_t batch = 16;  // per rank
  double lr = 0.02;        // per rank-batch; the optimizer gets lr × size
  std::string optimizer = "sgd";
  std::size_t hidden = 48;
  std::string compression;  // empty: KOLO_COMPRESSION
  std::string checkpoint = "train_mlp.ckpt";
  double min_accuracy = 0;
  bool quiet = false;
  bool native_mpi = false;  // train_mlp_mpi: MPI's collectives instead of kolo's algorithms
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw kolo::ConfigError(k + " needs a value");
      return argv[++i];
    };
    if (k == "--epochs") {
      a.epochs = std::atoi(val().c_str());
    } else if (k == "--batch") {
      a.batch = static_cast<std::size_t>(std::atol(val().c_str()));
    } else if (k == "--lr") {
      a.lr = std::atof(val().c_str());
    } else if (k == "--optimizer") {
      a.optimizer = val();
    } else if (k == "--hidden") {
      a.hidden = static_cast<std::size_t>(std::atol(val().c_str()));
    } else if (k == "--compression") {
      a.compression = val();
    } else if (k == "--checkpoint") {
      a.checkpoint = val();
    } else if (k == "--min-accuracy") {
      a.min_accuracy = std::atof(val().c_str());
    } else if (k == "--quiet") {
      a.quiet = true;
    } else if (k == "--native-mpi") {
      a.native_mpi = true;
    } else {
      throw kolo::ConfigError("unknown option " + k + " (see the comment at the top of " +
                              "examples/train_mlp.cpp)");
    }
  }
  if (a.epochs < 1 || a.batch < 1 || a.hidden < 1 || !(a.lr > 0)) {
    throw kolo::ConfigError("--epochs, --batch, --hidden and --lr must be positive");
  }
  if (a.optimizer != "sgd" && a.optimizer != "adam") {
    throw kolo::ConfigError("--optimizer must be sgd or adam, not " + a.optimizer);
  }
  return a;
}

template <class Opt, class T>
int train(const Args& args, kolo::Communicator<T> comm, Opt base_optimizer) {
  const Dataset train_set = two_spirals(1000, 2024, 0.0);
  const Dataset test_set = two_spirals(500, 7, 0.5);  // between the training points
  Mlp model(args.hidden, 1);

  kolo::DistributedOptions dopts;
  if (!args.compression.empty())
    dopts.compression = kolo::CompressionPolicy::parse(args.compression);
  kolo::DistributedOptimizer<Opt, T> opt(std::move(comm), std::move(base_optimizer),
                                         model.parameters(), dopts);
  const int rank = opt.rank(), size = opt.size();
  const auto n = static_cast<std::size_t>(size), r = static_cast<std::size_t>(rank);
  // Horovod's idiom: everyone starts from rank 0's weights and optimizer state.
  opt.broadcast_parameters(0);
  opt.broadcast_optimizer_state(0);

  const std::size_t global_batch = args.batch * n;
  const std::size_t steps_per_epoch = train_set.size() / global_batch;
  if (steps_per_epoch == 0) throw kolo::ConfigError("--batch × ranks exceeds the data set");
  if (rank == 0) {
    std::printf(
        "train_mlp: %d rank(s), two spirals (%zu train / %zu test), MLP 2-%zu-%zu-2, %s, "
        "batch %zu per rank (%zu global), %zu steps per epoch, compression %s\n",
        size, train_set.size(), test_set.size(), args.hidden, args.hidden, args.optimizer.c_str(),
        args.batch, global_batch, steps_per_epoch,
        args.compression.empty() ? "from KOLO_COMPRESSION" : args.compression.c_str());
  }

  std::vector<std::size_t> perm(train_set.size());
  std::vector<float> xb(args.batch * 2);
  std::vector<int> yb(args.batch);
  double train_seconds = 0;
  std::size_t steps = 0;
  for (int epoch = 1; epoch <= args.epochs; ++epoch) {
    // The same permutation on every rank: Fisher-Yates driven by the epoch number.
    for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = i;
    Rng rng{static_cast<std::uint64_t>(epoch)};
    for (std::size_t i = perm.size() - 1; i > 0; --i)
      std::swap(perm[i], perm[rng.next() % (i + 1)]);

    const auto t0 = std::chrono::steady_clock::now();
    double loss_sum[2] = {0, 0};  // this rank's loss · samples, samples
    for (std::size_t s = 0; s < steps_per_epoch; ++s) {
      for (std::size_t k = 0; k < args.batch; ++k) {  // this rank's slice of the global batch
        const std::size_t idx = perm[s * global_batch + r * args.batch + k];
        xb[2 * k] = train_set.x[2 * idx];
        xb[2 * k + 1] = train_set.x[2 * idx + 1];
        yb[k] = train_set.y[idx];
      }
      const double loss = model.train_batch(xb.data(), yb.data(), args.batch,
                                            [&](std::size_t i) { opt.gradient_ready(i); });
      opt.step();
      loss_sum[0] += loss * static_cast<double>(args.batch);
      loss_sum[1] += static_cast<double>(args.batch);
    }
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    steps += steps_per_epoch;
    opt.engine()
        .allreduce_async("epoch_loss", kolo::TensorView(std::span<double>(loss_sum)),
                         kolo::ReduceOp::sum)
        .wait();
    if (rank == 0 && (!args.quiet || epoch == args.epochs || epoch % 20 == 0)) {
      std::printf("epoch %3d  loss %.4f\n", epoch, loss_sum[0] / loss_sum[1]);
    }
  }

  // Accuracy on the test set: each rank scores a slice, the counts are summed.
  const std::size_t per = (test_set.size() + n - 1) / n;
  const std::size_t first = std::min(test_set.size(), r * per);
  const std::size_t count = std::min(test_set.size(), first + per) - first;
  double score[2] = {static_cast<double>(model.correct(test_set, first, count)),
                     static_cast<double>(count)};
  opt.engine()
      .allreduce_async("accuracy", kolo::TensorView(std::span<double>(score)), kolo::ReduceOp::sum)
      .wait();
  const double accuracy = score[0] / score[1];

  if (rank == 0) {
    auto params = opt.parameters();
    write_checkpoint(args.checkpoint, params);
    const bool ok = checkpoint_matches(args.checkpoint, params);
    std::printf("checkpoint %s written by rank 0 (%s)\n", args.checkpoint.c_str(),
                ok ? "read back: identical" : "read back: DIFFERENT");
    if (!ok) return 1;
    std::printf("final accuracy %.4f on %zu test points\n", accuracy, test_set.size());
    std::printf("speed: %zu steps in %.3f s = %.1f steps/s, %.0f samples/s (%d ranks)\n", steps,
                train_seconds, static_cast<double>(steps) / train_seconds,
                static_cast<double>(steps * global_batch) / train_seconds, size);
  }
  if (accuracy < args.min_accuracy) {
    if (rank == 0) {
      std::printf("accuracy %.4f is below --min-accuracy %.4f\n", accuracy, args.min_accuracy);
    }
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse(argc, argv);
    const auto run = [&](auto comm) {
      const double lr = args.lr * comm.size();  // the global batch is size × larger
      if (args.optimizer == "adam") return train(args, std::move(comm), kolo::Adam({.lr = lr}));
      return train(args, std::move(comm), kolo::SGD({.lr = lr, .momentum = 0.9}));
    };
#if defined(KOLO_EXAMPLE_MPI)
    if (args.native_mpi) {
      return run(kolo::Communicator<kolo::MpiNativeTransport>(
          std::make_unique<kolo::MpiNativeTransport>()));
    }
    return run(kolo::Communicator<kolo::MpiTransport>(std::make_unique<kolo::MpiTransport>()));
#else
    if (args.native_mpi) throw kolo::ConfigError("--native-mpi needs the train_mlp_mpi build");
    return run(kolo::Communicator<>::from_env());
#endif
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "train_mlp: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
}
