// kolo/communicator/alltoallv.hpp — Communicator::alltoallv: blocks of per-peer counts, pairwise.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
void Communicator<T>::alltoallv(TensorView in, std::span<const std::size_t> send_counts,
                                TensorView out, std::span<const std::size_t> recv_counts) {
  std::size_t sent = 0;
  for (std::size_t c : send_counts) sent += c;
  run(Collective::alltoallv, in.dtype, ReduceOp::sum, 0, -1, 0, [&](const AlgoOptions& opt) {
    check_cpu(in, "alltoallv input");
    check_cpu(out, "alltoallv output");
    same_type(in, out, "alltoallv");
    const auto n = static_cast<std::size_t>(size());
    if (send_counts.size() != n || recv_counts.size() != n) {
      throw ConfigError("alltoallv: send_counts has " + std::to_string(send_counts.size()) +
                        " and recv_counts " + std::to_string(recv_counts.size()) + " entries for " +
                        std::to_string(n) + " ranks");
    }
    std::size_t received = 0;
    for (std::size_t c : recv_counts) received += c;
    if (sent > in.count) {
      throw ConfigError("alltoallv: send_counts add up to " + std::to_string(sent) +
                        " elements but the input has " + std::to_string(in.count));
    }
    if (received > out.count) {
      throw ConfigError("alltoallv: recv_counts add up to " + std::to_string(received) +
                        " elements but the output has " + std::to_string(out.count));
    }
    check_overlap("alltoallv", TensorView(in.data, sent, in.dtype),
                  TensorView(out.data, received, out.dtype), nullptr);
    alltoallv_pairwise(*transport_, in.data, send_counts, out.data, recv_counts,
                       dtype_size(in.dtype), opt);
  });
}

}  // namespace kolo
