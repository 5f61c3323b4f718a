// kolo/communicator/split.hpp — Communicator::split (MPI_Comm_split): new communicators over
// this one's rendezvous store.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
std::optional<Communicator<T>> Communicator<T>::split(int color, int key) {
  std::vector<std::int64_t> all(2 * static_cast<std::size_t>(size()));
  std::int64_t mine[2] = {color, key};
  allgather(TensorView(mine, 2, DataType::int64),
            TensorView(all.data(), all.size(), DataType::int64));
  const std::uint64_t seq = ++split_seq_;
  std::vector<std::pair<std::int64_t, int>> members;  // (key, rank) of my color
  for (int q = 0; q < size(); ++q) {
    const std::int64_t c = all[2 * static_cast<std::size_t>(q)];
    if (c < 0 && c != kUndefinedColor) {
      throw ConfigError("split: rank " + std::to_string(q) + " passed color " + std::to_string(c) +
                        ": colors are >= 0, or kolo::kUndefinedColor (-1) to join no group");
    }
    if (c == color) members.emplace_back(all[2 * static_cast<std::size_t>(q) + 1], q);
  }
  if (color == kUndefinedColor) return std::nullopt;
  if constexpr (!Connectable<T>) {
    throw ConfigError(
        "split: this communicator adopted a transport that is not built through a rendezvous "
        "store (e.g. MPI); split the MPI communicator (MPI_Comm_split) and adopt the result");
  } else {
    if (!boot_) {
      throw ConfigError(
          "split: this communicator adopted a transport without a rendezvous store (e.g. "
          "MPI); split the MPI communicator (MPI_Comm_split) and adopt the result instead");
    }
    std::sort(members.begin(), members.end());
    Topology t = topo_;
    t.size = static_cast<int>(members.size());
    for (std::size_t i = 0; i < members.size(); ++i) {
      if (members[i].second == rank()) t.rank = static_cast<int>(i);
    }
    t.local_rank = t.local_size = t.cross_rank = t.cross_size = -1;
    t.listen_fd = -1;
    const std::string prefix =
        boot_->prefix() + "split/" + std::to_string(seq) + "/" + std::to_string(color) + "/";
    return Communicator(std::move(t), boot_->shared_store(), prefix, opts_);
  }
}

}  // namespace kolo
