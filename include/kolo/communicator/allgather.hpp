// kolo/communicator/allgather.hpp — Communicator::allgather and allgatherv: checks, the native
// hook, and the one place that runs the Selector's allgather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::allgather(TensorView in, TensorView out) {
  run(Collective::allgather, in.dtype, ReduceOp::sum, in.count, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "allgather input");
    check_cpu(out, "allgather output");
    same_type(in, out, "allgather");
    checks::check_size_multiple(out.count, in.count, size(), "allgather", "output", "input");
    check_overlap("allgather", in, out,
                  out.byte_data() + static_cast<std::size_t>(rank()) * in.bytes());
    const std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.count);
    if constexpr (HasNativeAllgatherv<T>) {
      if (transport_->native_allgatherv(in.data, out.data, counts, in.dtype, opt)) return;
    }
    run_allgather(in.data, out.data, counts, dtype_size(in.dtype), opt);
  });
}

template <class T>
void Communicator<T>::allgatherv(TensorView in, TensorView out,
                                 std::span<const std::size_t> counts) {
  // The counts' hash travels in the signature: ranks that disagree on them are caught.
  std::uint64_t h = 1469598103934665603ull;
  std::size_t sum = 0;
  for (std::size_t c : counts) {
    h = (h ^ c) * 1099511628211ull;
    sum += c;
  }
  // Ranks contribute different counts here, so the signature carries the total.
  run(Collective::allgatherv, in.dtype, ReduceOp::sum, sum, -1, h, [&](const AlgoOptions& opt) {
    check_cpu(in, "allgatherv input");
    check_cpu(out, "allgatherv output");
    same_type(in, out, "allgatherv");
    if (counts.size() != static_cast<std::size_t>(size())) {
      throw ConfigError("allgatherv: counts has " + std::to_string(counts.size()) +
                        " entries for " + std::to_string(size()) + " ranks");
    }
    if (counts[static_cast<std::size_t>(rank())] != in.count) {
      throw ConfigError("allgatherv: counts[" + std::to_string(rank()) +
                        "] = " + std::to_string(counts[static_cast<std::size_t>(rank())]) +
                        " but this rank's input has " + std::to_string(in.count) + " elements");
    }
    std::size_t total = 0;  // saturating: counts that wrap can match no output
    for (std::size_t c : counts) total = detail::saturating_add(total, c);
    if (out.count != total) {
      throw ConfigError("allgatherv: output has " + std::to_string(out.count) +
                        " elements, the counts add up to " + std::to_string(total));
    }
    const std::size_t before =
        std::accumulate(counts.begin(), counts.begin() + rank(), std::size_t{0});
    check_overlap("allgatherv", in, out, out.byte_data() + before * dtype_size(out.dtype));
    if constexpr (HasNativeAllgatherv<T>) {
      if (transport_->native_allgatherv(in.data, out.data, counts, in.dtype, opt)) return;
    }
    run_allgather(in.data, out.data, counts, dtype_size(in.dtype), opt);
  });
}

template <class T>
void Communicator<T>::run_allgather(const void* in, void* out, std::span<const std::size_t> counts,
                                    std::size_t elem_size, const AlgoOptions& opt) {
  AllgatherArgs a;
  a.in = in;
  a.out = out;
  a.counts = counts;
  a.elem_size = elem_size;
  select_run<AllgatherAlgorithm>(a, opt);
}

}  // namespace kolo
