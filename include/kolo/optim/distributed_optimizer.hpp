// kolo/optim/distributed_optimizer.hpp — data-parallel training: average every parameter's
// gradient across ranks through the Engine, then let a wrapped optimizer apply it.
//
// What Horovod's hvd.DistributedOptimizer does for PyTorch, for a C++ training loop:
//
//   auto comm = kolo::Communicator<>::from_env();
//   const double lr = 0.02 * comm.size();       // the global batch is size times larger
//   kolo::DistributedOptimizer opt(std::move(comm), kolo::SGD({.lr = lr, .momentum = 0.9}),
//                                  params);     // std::vector<kolo::Parameter>
//   opt.broadcast_parameters(0);                // every rank starts from rank 0's weights
//   for (...) {
//     model.backward(batch, [&](std::size_t i) { opt.gradient_ready(i); });
//     opt.step();                               // wait for the averages, apply SGD
//   }
//
// * Overlap. gradient_ready(p) hands p's gradient to the engine (no copy), so the allreduce of
//   the last layers runs while the backward pass computes the first ones. step() waits for all
//   of them, then steps.
// * Buckets (bucket_bytes, default 25 MiB; the first 1 MiB), as PyTorch DDP's: the parameters
//   are cut, from the last to the first (the order a backward pass produces their gradients), into
//   buckets of about that many bytes of gradient; a bucket goes to the engine as one coalesced
//   submission (one handle, one negotiation entry, in place on the grad spans) once every one of
//   its gradients is reported, in any order. The engine fuses the buckets that are ready together.
//   The buckets depend only on the parameters' order and sizes, so they are the same on every rank
//   of a replicated model. bucket_bytes = 0: each gradient is its own submission (Horovod's way).
// * Averaging (op = average): prescale 1/f, postscale f, and the engine divides by size — the
//   result is the mean over ranks for any f = gradient_predivide_factor. Dividing by f before the
//   sum keeps fp16-compressed sums of many ranks from overflowing; f/size after restores scale.
// * Accumulation (backward_passes_per_step = k): the gradient is added into a local buffer on each
//   of k passes and allreduced on the k-th; with average_aggregated_gradients (default) the sum is
//   also divided by k, so k passes over micro-batches of b samples give the same update as one
//   pass over k·b samples. Each pass overwrites p.grad; the optimizer accumulates.
// * Missing gradients: a parameter whose gradient_ready() was not called on this rank (a branch
//   of the model that this rank's batch did not use) contributes zeros, submitted by step(), as
//   Horovod does — the average still divides by the full size, and every rank applies the same
//   update, so parameters never diverge. With k > 1, passes that did not produce a gradient
//   count as zeros too.
// * Broadcast: broadcast_parameters / broadcast_optimizer_state copy root's bytes to every rank.
// * Compression: DistributedOptions::compression, else KOLO_COMPRESSION (EngineOptions) —
//   gradients cross the wire as fp16/bf16, arithmetic and the optimizer stay fp32.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"
#include "kolo/compression/compressor.hpp"
#include "kolo/core/error.hpp"
#include "kolo/engine/engine.hpp"
#include "kolo/optim/parameter.hpp"

namespace kolo {

struct DistributedOptions {
  ReduceOp op = ReduceOp::average;           // average or sum
  double gradient_predivide_factor = 1.0;    // average only: prescale 1/f, postscale f/size
  int backward_passes_per_step = 1;          // k: allreduce every k-th backward pass
  bool average_aggregated_gradients = true;  // divide the k passes' sum by k
  // Wire format of the gradients; unset: KOLO_COMPRESSION. Only for an optimizer that builds its
  // own engine — a shared engine's EngineOptions::compression decides for all its tensors.
  std::optional<CompressionPolicy> compression;
  // Prefix of the engine's tensor names: lets two optimizers share one engine.
  std::string name_prefix = "kolo.optim/";
  // Gradient bytes per bucket (see the top of this file); 0: no buckets, one engine submission
  // per gradient. The first bucket (the last parameters) holds first_bucket_bytes, so that
  // communication starts early in the backward pass; 0 there: bucket_bytes.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // At construction, check that every rank has the same parameters (count, order, names and
  // sizes) with one allgather through the engine, as PyTorch DDP checks its model: a difference
  // is a MismatchError on every rank naming the first parameter that differs, instead of a step
  // that waits for a bucket the other ranks never submit. Every rank must then construct its
  // optimizer at the same point (it is a collective); false skips the check.
  bool verify_parameters = true;
};

template <Optimizer Opt, Transport T = DefaultTransport>
class DistributedOptimizer {
 public:
  // Builds and owns an engine over `comm`.
  DistributedOptimizer(Communicator<T> comm, Opt opt, std::vector<Parameter> params,
                       DistributedOptions o = {}, EngineOptions eo = EngineOptions::from_env())
      : opt_(std::move(opt)), params_(std::move(params)), opts_(std::move(o)) {
    if (opts_.compression) eo.compression = *opts_.compression;
    validate();
    owned_ = std::make_unique<Engine<T>>(std::move(comm), std::move(eo));
    engine_ = owned_.get();
    if (opts_.verify_parameters) verify_parameters();
  }

  // Shares `engine` (which must outlive this optimizer); its options decide compression.
  DistributedOptimizer(Engine<T>& engine, Opt opt, std::vector<Parameter> params,
                       DistributedOptions o = {})
      : engine_(&engine), opt_(std::move(opt)), params_(std::move(params)), opts_(std::move(o)) {
    if (opts_.compression) {
      throw ConfigError(
          "DistributedOptimizer: compression is set by the shared engine's "
          "EngineOptions::compression (or KOLO_COMPRESSION), not by DistributedOptions");
    }
    validate();
    if (opts_.verify_parameters) verify_parameters();
  }

  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Gradients still in flight must not land in freed memory: an owned engine is shut down first
  // (its pending operations fail at once, on every rank); with a shared engine this waits for
  // them (they finish, or fail when a peer is lost or the engine shuts down).
  ~DistributedOptimizer() {
    owned_.reset();
    auto settle = [](Handle& h) {
      if (!h.valid()) return;
      try {
        h.wait();
      } catch (...) {  // reported by step() to whoever still trains; nothing to add here
      }
    };
    settle(list_);
    for (Slot& s : slots_) settle(s.handle);
    for (Bucket& b : buckets_) settle(b.handle);
  }

  int rank() const { return engine_->rank(); }
  int size() const { return engine_->size(); }
  Engine<T>& engine() { return *engine_; }
  Opt& optimizer() { return opt_; }
  std::span<Parameter> parameters() { return params_; }
  const DistributedOptions& options() const { return opts_; }
  // The buckets, each a list of parameter indices (empty when bucket_bytes = 0). Bucket b's
  // engine name is name_prefix + "bucket/" + b: the name an engine error or timeline shows.
  std::vector<std::vector<std::size_t>> buckets() const {
    std::vector<std::vector<std::size_t>> out;
    for (const Bucket& b : buckets_) out.push_back(b.members);
    return out;
  }

  // The backward pass has written parameter i's gradient (of this micro-batch) into its grad
  // span: accumulate it and, on the k-th pass, start its allreduce. The grad buffer belongs to
  // the engine until step() returns. Thread-safe (a backward pass may report from any thread).
  void gradient_ready(std::size_t i) {
    std::lock_guard lock(mu_);
    if (i >= params_.size()) {
      throw ConfigError("DistributedOptimizer: no parameter " + std::to_string(i) + " (there are " +
                        std::to_string(params_.size()) + ")");
    }
    Slot& s = slots_[i];
    Parameter& p = params_[i];
    const int k = opts_.backward_passes_per_step;
    if (s.passes >= k || list_.valid()) {
      throw Error("DistributedOptimizer: gradient of '" + p.name + "' reported more than " +
                  "backward_passes_per_step = " + std::to_string(k) +
                  " times before step(); call step() after every k backward passes");
    }
    ++s.passes;
    if (!buckets_.empty()) {
      // A bucket's list is the grad spans: on the k-th pass the grad becomes the passes' sum.
      if (k > 1) {
        if (s.passes == 1) {
          std::copy(p.grad.begin(), p.grad.end(), s.accum.begin());
        } else if (s.passes < k) {
          for (std::size_t e = 0; e < p.grad.size(); ++e) s.accum[e] += p.grad[e];
        } else {
          for (std::size_t e = 0; e < p.grad.size(); ++e) p.grad[e] += s.accum[e];
        }
      }
      if (s.passes == k) {
        Bucket& b = buckets_[s.bucket];
        if (--b.waiting == 0) submit_bucket(b);
      }
      return;
    }
    if (k == 1) {
      submit(i, p.grad);
      return;
    }
    if (s.passes == 1) {
      std::copy(p.grad.begin(), p.grad.end(), s.accum.begin());
    } else {
      for (std::size_t e = 0; e < p.grad.size(); ++e) s.accum[e] += p.grad[e];
    }
    if (s.passes == k) submit(i, s.accum);
  }
  void gradient_ready(std::string_view name) { gradient_ready(index_of(name)); }
  // Every parameter's gradient at once (a backward pass that cannot report one by one): the same
  // as gradient_ready(i) for every i. With buckets, each bucket is submitted as it completes.
  // Without them (bucket_bytes = 0), k = 1 and nothing reported yet this step, the gradients go
  // to the engine as one coalesced submission (Engine::allreduce_coalesced_async, one handle and
  // one negotiation entry for the whole list, in place on the grad spans) instead of one
  // submission per parameter; every rank must then report the same way, since the list and
  // single gradients have different engine names.
  void gradients_ready() {
    {
      std::lock_guard lock(mu_);
      if (buckets_.empty() && opts_.backward_passes_per_step == 1 && !params_.empty() &&
          !list_.valid() && std::none_of(slots_.begin(), slots_.end(), [](const Slot& s) {
            return s.handle.valid();
          })) {
        const double f = opts_.op == ReduceOp::average ? opts_.gradient_predivide_factor : 1.0;
        list_ = engine_->allreduce_coalesced_async(list_name_, list_views_, opts_.op, 1.0 / f, f);
        return;
      }
    }
    for (std::size_t i = 0; i < params_.size(); ++i) gradient_ready(i);
  }

  // Submits zeros for every parameter that has no gradient in flight, then waits for all: on
  // return every grad span holds the averaged gradient. Rethrows the engine's error, if any.
  void synchronize() {
    std::vector<Handle>& handles = waiting_;  // reused: a step allocates nothing here
    handles.clear();
    {
      std::lock_guard lock(mu_);
      const bool listed = list_.valid();  // gradients_ready() submitted them as one list
      if (listed) {
        handles.push_back(std::move(list_));
        list_ = Handle();
      }
      for (Bucket& b : buckets_) {
        if (!b.handle.valid()) {
          // Missing gradients (see the top of this file): zeros, or the passes there were.
          for (std::size_t i : b.members) {
            Slot& s = slots_[i];
            if (s.passes == opts_.backward_passes_per_step) continue;
            Parameter& p = params_[i];
            if (s.passes == 0) {
              std::fill(p.grad.begin(), p.grad.end(), 0.0f);
            } else {
              std::copy(s.accum.begin(), s.accum.end(), p.grad.begin());
            }
          }
          submit_bucket(b);
        }
        handles.push_back(std::move(b.handle));
        b.handle = Handle();
        b.waiting = b.members.size();
      }
      for (std::size_t i = 0; !listed && buckets_.empty() && i < params_.size(); ++i) {
        Slot& s = slots_[i];
        if (s.handle.valid()) continue;
        Parameter& p = params_[i];
        if (opts_.backward_passes_per_step == 1) {
          std::fill(p.grad.begin(), p.grad.end(), 0.0f);  // missing: contribute zeros
          submit(i, p.grad);
        } else {
          // Passes that did not produce the gradient count as zeros; none did: all zeros.
          if (s.passes == 0) std::fill(s.accum.begin(), s.accum.end(), 0.0f);
          submit(i, s.accum);
        }
      }
      for (Slot& s : slots_) {
        if (s.handle.valid()) handles.push_back(std::move(s.handle));
        s.handle = Handle();
        s.passes = 0;
      }
    }
    for (std::size_t j = 0; j < handles.size(); ++j) {
      try {
        handles[j].wait();
      } catch (const MismatchError& e) {
        // With buckets, handle j is bucket j's: say which parameter the engine's index means.
        if (j >= buckets_.size()) throw;
        throw MismatchError(e.what() + bucket_hint(buckets_[j], e.tensor_index()),
                            e.tensor_index());
      }
    }
    handles.clear();
  }

  // The constructor's parameter check (DistributedOptions::verify_parameters; nothing when it is
  // off), once more: after Engine::grow the members run it to meet the check in the joiners'
  // constructors (ElasticState's admission does). Collective over the engine's ranks.
  void verify_parameters_again() {
    if (opts_.verify_parameters) verify_parameters();
  }

  // Forgets this step's gradients and their handles, as if step() had just returned: after the
  // engine failed (the handles hold its error; the grad spans may hold partial sums), before
  // the training loop resumes from a restored commit (ElasticState::restore calls it).
  void reset_pending() {
    std::lock_guard lock(mu_);
    list_ = Handle();
    for (Slot& s : slots_) {
      s.handle = Handle();
      s.passes = 0;
    }
    for (Bucket& b : buckets_) {
      b.handle = Handle();
      b.waiting = b.members.size();
    }
    waiting_.clear();
  }

  // synchronize(), then the wrapped optimizer's step on the averaged gradients.
  void step() {
    synchronize();
    opt_.step(std::span<Parameter>(params_));
  }

  // Every rank's parameter values become root's, bit for bit (before training, after a restore).
  void broadcast_parameters(int root = 0) {
    require_idle("broadcast_parameters");
    std::vector<Handle> hs;
    for (Parameter& p : params_) {
      hs.push_back(engine_->broadcast_async(opts_.name_prefix + "param/" + p.name,
                                            TensorView(p.value), root));
    }
    for (Handle& h : hs) h.wait();
  }

  // Every rank's optimizer state (momentum buffers, step counters) becomes root's; state that
  // does not exist yet is created (zeros) first, so this also works before the first step.
  void broadcast_optimizer_state(int root = 0) requires StatefulOptimizer<Opt> {
    require_idle("broadcast_optimizer_state");
    std::vector<Handle> hs;
    for (StateTensor& s : opt_.state(std::span<const Parameter>(params_))) {
      hs.push_back(engine_->broadcast_async(opts_.name_prefix + "state/" + s.name, s.tensor, root));
    }
    for (Handle& h : hs) h.wait();
  }

 private:
  struct Slot {
    int passes = 0;
    std::string grad_name;  // the engine's name for the gradient, built once
    Handle handle;
    std::vector<float> accum;  // k > 1: the sum of this step's passes
    std::size_t bucket = 0;    // with buckets: its bucket
  };
  struct Bucket {
    std::vector<std::size_t> members;  // parameter indices, in submission order
    std::vector<TensorView> views;     // their grad spans
    std::string name;
    std::size_t waiting = 0;  // members not yet reported k times this step
    Handle handle;
  };

  void validate() {
    const auto& o = opts_;
    if (o.op != ReduceOp::average && o.op != ReduceOp::sum) {
      throw ConfigError("DistributedOptimizer: op must be average or sum");
    }
    if (!(o.gradient_predivide_factor > 0.0)) {
      throw ConfigError("DistributedOptimizer: gradient_predivide_factor must be positive, got " +
                        std::to_string(o.gradient_predivide_factor));
    }
    if (o.gradient_predivide_factor != 1.0 && o.op != ReduceOp::average) {
      throw ConfigError("DistributedOptimizer: gradient_predivide_factor needs op = average");
    }
    if (o.backward_passes_per_step < 1) {
      throw ConfigError("DistributedOptimizer: backward_passes_per_step must be >= 1, got " +
                        std::to_string(o.backward_passes_per_step));
    }
    slots_.resize(params_.size());
    for (std::size_t i = 0; i < params_.size(); ++i) {
      const Parameter& p = params_[i];
      if (p.grad.size() != p.value.size()) {
        throw ConfigError("DistributedOptimizer: parameter '" + p.name + "' has " +
                          std::to_string(p.value.size()) + " values but " +
                          std::to_string(p.grad.size()) + " gradients");
      }
      if (!index_.emplace(p.name, i).second) {
        throw ConfigError("DistributedOptimizer: two parameters are named '" + p.name + "'");
      }
      if (o.backward_passes_per_step > 1) slots_[i].accum.assign(p.value.size(), 0.0f);
      slots_[i].grad_name = o.name_prefix + "grad/" + p.name;
      list_views_.emplace_back(p.grad);
    }
    list_name_ = o.name_prefix + "grads";
    make_buckets();
  }

  // DistributedOptions::verify_parameters: every rank sends "count\0name\0size\0..." for its
  // parameters; every rank compares each rank's list with rank 0's, so all find the same first
  // difference (lowest rank, then lowest index) and throw the same error.
  void verify_parameters() {
    std::string mine = std::to_string(params_.size());
    mine.push_back('\0');
    for (const Parameter& p : params_) {
      mine += p.name;
      mine.push_back('\0');
      mine += std::to_string(p.value.size());
      mine.push_back('\0');
    }
    Handle h = engine_->allgather_async(
        opts_.name_prefix + "parameters",
        TensorView(reinterpret_cast<std::uint8_t*>(mine.data()), mine.size(), DataType::uint8));
    const TensorView all = h.output();
    const auto* bytes = static_cast<const char*>(all.data);
    using Layout = std::vector<std::string>;  // count, then name and size per parameter
    std::vector<Layout> ranks;
    std::size_t at = 0;
    for (std::size_t c : h.counts()) {
      Layout& l = ranks.emplace_back();
      for (std::size_t i = at, from = at; i < at + c; ++i) {
        if (bytes[i] == '\0') {
          l.emplace_back(bytes + from, i - from);
          from = i + 1;
        }
      }
      at += c;
    }
    auto describe = [](const Layout& l, std::size_t i) {
      return "'" + l[1 + 2 * i] + "' (" + l[2 + 2 * i] + " elements)";
    };
    const Layout& first = ranks[0];
    for (std::size_t r = 1; r < ranks.size(); ++r) {
      const Layout& l = ranks[r];
      const std::size_t n = std::min(l.size(), first.size()) / 2;
      for (std::size_t i = 0; i < n; ++i) {
        if (l[1 + 2 * i] == first[1 + 2 * i] && l[2 + 2 * i] == first[2 + 2 * i]) continue;
        throw MismatchError("DistributedOptimizer: the ranks' parameters differ: parameter " +
                            std::to_string(i) + " is " + describe(l, i) + " on rank " +
                            std::to_string(r) + " but " + describe(first, i) +
                            " on rank 0 (every rank needs the same parameters, in the same "
                            "order, names and sizes)");
      }
      if (l.size() != first.size()) {
        const bool more = l.size() > first.size();
        throw MismatchError("DistributedOptimizer: the ranks' parameters differ: rank " +
                            std::to_string(r) + " has " + l[0] + " parameters but rank 0 has " +
                            first[0] + " (the first extra one is " + describe(more ? l : first, n) +
                            " on rank " + (more ? std::to_string(r) : std::string("0")) +
                            "; every rank needs the same parameters)");
      }
    }
  }

  // Cuts the parameters, from the last to the first, into buckets of up to bucket_bytes of
  // gradient (the first bucket first_bucket_bytes); a larger parameter is a bucket of its own.
  // Within a bucket the members keep the parameters' order (their memory is usually ascending).
  void make_buckets() {
    if (opts_.bucket_bytes == 0 || params_.empty()) return;
    std::size_t cap = opts_.first_bucket_bytes > 0 ? opts_.first_bucket_bytes : opts_.bucket_bytes;
    std::size_t bytes = 0;
    std::vector<std::size_t> current;
    auto close = [&] {
      Bucket& b = buckets_.emplace_back();
      b.members.assign(current.rbegin(), current.rend());
      for (std::size_t i : b.members) {
        b.views.emplace_back(params_[i].grad);
        slots_[i].bucket = buckets_.size() - 1;
      }
      b.name = opts_.name_prefix + "bucket/" + std::to_string(buckets_.size() - 1);
      b.waiting = b.members.size();
      current.clear();
      bytes = 0;
      cap = opts_.bucket_bytes;
    };
    for (std::size_t i = params_.size(); i-- > 0;) {
      const std::size_t g = params_[i].grad.size() * sizeof(float);
      if (!current.empty() && bytes + g > cap) close();
      current.push_back(i);
      bytes += g;
    }
    close();
  }

  // Submits bucket b's list, in place on its grad spans (each holding the sum of its passes).
  void submit_bucket(Bucket& b) {
    const double k = opts_.average_aggregated_gradients ? opts_.backward_passes_per_step : 1;
    const double f = opts_.op == ReduceOp::average ? opts_.gradient_predivide_factor : 1.0;
    b.handle = engine_->allreduce_coalesced_async(b.name, b.views, opts_.op, 1.0 / (f * k), f);
  }

  // For an engine mismatch error about tensor k of bucket b's list (MismatchError::tensor_index):
  // which parameter that is, on this rank.
  std::string bucket_hint(const Bucket& b, long k) const {
    if (k < 0 || static_cast<std::size_t>(k) >= b.members.size()) return "";
    return "; in DistributedOptimizer bucket '" + b.name + "' tensor " + std::to_string(k) +
           " is parameter '" + params_[b.members[static_cast<std::size_t>(k)]].name +
           "' on this rank (every rank needs the same parameters, in the same order and sizes)";
  }

  std::size_t index_of(std::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) {
      throw ConfigError("DistributedOptimizer: no parameter named '" + std::string(name) + "'");
    }
    return it->second;
  }

  // Allreduces `src` into parameter i's grad span (in place when src is the grad itself).
  void submit(std::size_t i, std::span<float> src) {
    Parameter& p = params_[i];
    const double k = opts_.average_aggregated_gradients ? opts_.backward_passes_per_step : 1;
    const double f = opts_.op == ReduceOp::average ? opts_.gradient_predivide_factor : 1.0;
    slots_[i].handle = engine_->allreduce_async(slots_[i].grad_name, TensorView(src), opts_.op,
                                                1.0 / (f * k), f, TensorView(p.grad));
  }

  void require_idle(const char* what) {
    std::lock_guard lock(mu_);
    for (const Slot& s : slots_) {
      if (s.handle.valid() || s.passes > 0 || list_.valid()) {
        throw Error(std::string("DistributedOptimizer: ") + what +
                    " while gradients are pending; call step() first");
      }
    }
  }

  std::unique_ptr<Engine<T>> owned_;
  Engine<T>* engine_ = nullptr;
  Opt opt_;
  std::vector<Parameter> params_;
  DistributedOptions opts_;
  std::vector<Slot> slots_;
  std::vector<Bucket> buckets_;  // empty: bucket_bytes = 0
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };
  std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>> index_;
  std::vector<Handle> waiting_;  // synchronize()'s handles
  // gradients_ready()'s one submission: every grad span, in place, under one engine name.
  std::vector<TensorView> list_views_;
  std::string list_name_;
  Handle list_;
  std::mutex mu_;
};

}  // namespace kolo
