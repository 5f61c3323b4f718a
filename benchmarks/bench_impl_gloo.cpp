// bench_impl_gloo.cpp — kolo-bench's `--impl gloo` and `--impl gloo-ring-chunked`: Gloo (Debian
// libgloo-dev) over its TCP transport, rendezvousing through kolo's store so it runs under
// kolo-run like kolo does.
//
//   gloo               the new-style API PyTorch's ProcessGroupGloo uses: gloo::allreduce (ring),
//                      gloo::allgather, gloo::broadcast, gloo::alltoall; reduce_scatter through
//                      the only Gloo algorithm for it, ReduceScatterHalvingDoubling.
//   gloo-ring-chunked  allreduce through the old-style AllreduceRingChunked (Horovod's and
//                      Caffe2's), its algorithm objects built once per buffer, outside the loop.
//
// Gloo's reductions are its own (gloo/math.h), so this measures Gloo as its users get it. The
// old-style algorithms work in place; their out-of-place form copies the input first (timed).
// Gloo has no bfloat16 and no average: average is a sum plus one division pass (timed).
#include <gloo/algorithm.h>
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/reduce_scatter.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>

#include <kolo/core/reduce.hpp>
#include <kolo/topology/bootstrap.hpp>

#include "bench_impl.hpp"
#include "gloo_kolo_store.hpp"

namespace kolo::bench {

namespace {

// Calls f(T{}) with Gloo's element type for t; nullopt for bfloat16 (Gloo has none).
template <class F>
bool visit_gloo_type(DataType t, F&& f) {
  switch (t) {
    case DataType::float16:
      f(gloo::float16{});
      return true;
    case DataType::bfloat16:
      return false;
    case DataType::float32:
      f(float{});
      return true;
    case DataType::float64:
      f(double{});
      return true;
    case DataType::int8:
      f(std::int8_t{});
      return true;
    case DataType::uint8:
      f(std::uint8_t{});
      return true;
    case DataType::int32:
      f(std::int32_t{});
      return true;
    case DataType::int64:
      f(std::int64_t{});
      return true;
  }
  return false;
}

using ErasedFn = void (*)(void*, const void*, const void*, std::size_t);

template <class T>
ErasedFn gloo_erased_fn(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return static_cast<ErasedFn>(&gloo::sum<T>);
    case ReduceOp::product:
      return static_cast<ErasedFn>(&gloo::product<T>);
    case ReduceOp::min:
      return static_cast<ErasedFn>(&gloo::min<T>);
    case ReduceOp::max:
      return static_cast<ErasedFn>(&gloo::max<T>);
  }
  throw std::logic_error("unknown reduce op");
}

template <class T>
const gloo::ReductionFunction<T>* gloo_reduction(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average:
      return gloo::ReductionFunction<T>::sum;
    case ReduceOp::product:
      return gloo::ReductionFunction<T>::product;
    case ReduceOp::min:
      return gloo::ReductionFunction<T>::min;
    case ReduceOp::max:
      return gloo::ReductionFunction<T>::max;
  }
  throw std::logic_error("unknown reduce op");
}

class GlooImpl final : public Impl {
 public:
  explicit GlooImpl(bool ring_chunked)
      : ring_chunked_(ring_chunked), boot_(std::make_unique<Bootstrap>(Topology::from_env())) {
    const int rank = boot_->rank();
    const int size = boot_->size();
    gloo::transport::tcp::attr attr;
    // The address other ranks reach this one at: loopback when everything runs here.
    attr.hostname = boot_->advertised_ip();
    device_ = gloo::transport::tcp::CreateDevice(attr);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
    const auto timeout = std::chrono::milliseconds(
        static_cast<long long>(boot_->topology().timeout_seconds * 1000.0));
    ctx->setTimeout(timeout);
    if (boot_->store() != nullptr) {
      KoloGlooStore store(*boot_->store(), boot_->prefix() + "gloo/");
      ctx->connectFullMesh(store, device_);
    } else {
      gloo::rendezvous::HashStore store;  // one rank: nobody to meet
      ctx->connectFullMesh(store, device_);
    }
    ctx_ = std::move(ctx);
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }

  std::vector<std::string> describe() const override {
    return {
        "impl: gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
            std::to_string(GLOO_VERSION_MINOR) + "." + std::to_string(GLOO_VERSION_PATCH) +
            (ring_chunked_ ? " old-style AllreduceRingChunked (algorithm objects built per buffer)"
                           : " new-style API (gloo::allreduce ring, allgather, broadcast, "
                             "alltoall; ReduceScatterHalvingDoubling)"),
        "transport: gloo tcp, device " + device_->str() + ", rendezvous through the kolo store",
        "gloo: own reduction kernels (gloo/math.h); average = sum + one division pass; "
        "old-style out-of-place = input copy + in-place run",
    };
  }

  std::optional<std::string> unsupported(const OpSpec& s, bool in_place) const override {
    if (s.dtype == DataType::bfloat16) return "bfloat16 is not supported by gloo";
    if (ring_chunked_ && s.coll != Coll::allreduce) {
      return std::string(coll_name(s.coll)) +
             " is not supported by gloo-ring-chunked (allreduce only); use --impl gloo";
    }
    if (s.coll == Coll::alltoall && in_place && size() > 1) {
      return "in-place alltoall is not supported by gloo";
    }
    return std::nullopt;
  }

  BoundOp bind(const OpSpec& s, void* in, void* out, bool in_place) override {
    BoundOp b;
    visit_gloo_type(s.dtype,
                    [&](auto tag) { b = bind_typed<decltype(tag)>(s, in, out, in_place); });
    return b;
  }

  double sum_over_ranks(double v) override {
    double r = 0;
    gloo::AllreduceOptions opts(ctx_);
    opts.setInput(&v, 1);
    opts.setOutput(&r, 1);
    opts.setReduceFunction(static_cast<ErasedFn>(&gloo::sum<double>));
    opts.setTag(next_tag());
    gloo::allreduce(opts);
    return r;
  }

  void barrier() override {
    gloo::BarrierOptions opts(ctx_);
    opts.setTag(next_tag());
    gloo::barrier(opts);
  }

 private:
  // Every rank binds and runs in the same order, so the tags agree without talking.
  std::uint32_t next_tag() { return tag_++; }

  template <class T>
  BoundOp bind_typed(const OpSpec& s, void* in, void* out, bool in_place) {
    auto ctx = ctx_;
    const std::size_t n = static_cast<std::size_t>(size());
    const std::size_t count = s.count;
    const std::size_t block = count / n;
    const DataType dt = s.dtype;
    const bool avg = s.op == ReduceOp::average;
    const int nranks = size();
    T* tin = static_cast<T*>(in);
    T* tout = static_cast<T*>(out);
    std::uint32_t* tag = &tag_;
    switch (s.coll) {
      case Coll::allreduce: {
        if (ring_chunked_) {
          auto algo = std::make_shared<gloo::AllreduceRingChunked<T>>(
              ctx, std::vector<T*>{tout}, static_cast<int>(count), gloo_reduction<T>(s.op));
          const std::size_t bytes = count * sizeof(T);
          return {[=] {
                    if (!in_place) std::memcpy(static_cast<void*>(tout), tin, bytes);
                    algo->run();
                    if (avg) finish_average(tout, count, dt, nranks);
                  },
                  out};
        }
        const ErasedFn fn = gloo_erased_fn<T>(s.op);
        return {[=] {
                  gloo::AllreduceOptions opts(ctx);
                  if (!in_place) opts.setInput(tin, count);
                  opts.setOutput(tout, count);
                  opts.setReduceFunction(fn);
                  opts.setTag((*tag)++);
                  gloo::allreduce(opts);
                  if (avg) finish_average(tout, count, dt, nranks);
                },
                out};
      }
      case Coll::allgather:
        return {[=] {
                  gloo::AllgatherOptions opts(ctx);
                  if (!in_place) opts.setInput(tin, block);
                  opts.setOutput(tout, count);
                  opts.setTag((*tag)++);
                  gloo::allgather(opts);
                },
                out};
      case Coll::broadcast: {
        const bool root_input = !in_place && rank() == s.root;
        const int root = s.root;
        return {[=] {
                  gloo::BroadcastOptions opts(ctx);
                  if (root_input) opts.setInput(tin, count);
                  opts.setOutput(tout, count);
                  opts.setRoot(root);
                  opts.setTag((*tag)++);
                  gloo::broadcast(opts);
                },
                out};
      }
      case Coll::reduce_scatter: {
        // The halving-doubling algorithm reduces in its buffer and leaves this rank's block at
        // its start; out of place it works on a scratch copy of the input.
        std::shared_ptr<T[]> scratch;
        T* work = tin;
        if (!in_place) {
          scratch.reset(new T[count]);
          work = scratch.get();
        }
        auto algo = std::make_shared<gloo::ReduceScatterHalvingDoubling<T>>(
            ctx, std::vector<T*>{work}, static_cast<int>(count),
            std::vector<int>(n, static_cast<int>(block)), gloo_reduction<T>(s.op));
        const std::size_t bytes = count * sizeof(T);
        const std::size_t block_bytes = block * sizeof(T);
        return {[=] {
                  if (!in_place) std::memcpy(static_cast<void*>(work), tin, bytes);
                  algo->run();
                  if (!in_place) std::memcpy(static_cast<void*>(tout), work, block_bytes);
                  if (avg) finish_average(in_place ? work : tout, block, dt, nranks);
                  (void)scratch;  // keeps the scratch buffer alive as long as the op
                },
                in_place ? in : out};
      }
      case Coll::alltoall:
        return {[=] {
                  gloo::AlltoallOptions opts(ctx);
                  opts.setInput(tin, count);
                  opts.setOutput(tout, count);
                  opts.setTag((*tag)++);
                  gloo::alltoall(opts);
                },
                out};
    }
    throw std::logic_error("unknown collective");
  }

  bool ring_chunked_;
  std::unique_ptr<Bootstrap> boot_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> ctx_;
  std::uint32_t tag_ = 1;
};

}  // namespace

std::unique_ptr<Impl> make_gloo_impl(bool ring_chunked) {
  return std::make_unique<GlooImpl>(ring_chunked);
}

}  // namespace kolo::bench
