// kolo/communicator/shared_buffers.hpp — the buffers the local peers map: allocate_region (the
// collective that creates and maps them), the check of a Buffer handed to a collective, and the
// zero-copy allreduce that reads the peers' Buffers in place.
#pragma once

#include <unistd.h>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
std::shared_ptr<detail::SharedRegion> Communicator<T>::allocate_region(std::size_t bytes,
                                                                       std::size_t count,
                                                                       std::size_t elem_size) {
  if (!regions_) regions_ = std::make_shared<detail::RegionRegistry>();
  auto region = std::make_shared<detail::SharedRegion>();
  region->owner = regions_.get();
  region->id = regions_->next_id();
  region->peer_base.assign(static_cast<std::size_t>(size()), nullptr);
  region->peer_mapped.assign(static_cast<std::size_t>(size()), 0);
  const bool share = zero_copy_routes();
  // Created before the collective: a failure here is this rank's, and run() hands it to all.
  // pid, descriptor (-1: not offered), bytes asked for, bytes mapped, stamp.
  constexpr std::size_t kDesc = 5;
  std::int64_t mine[kDesc] = {static_cast<std::int64_t>(::getpid()), -1,
                              static_cast<std::int64_t>(bytes), 0, 0};
  std::vector<std::int64_t> all(kDesc * static_cast<std::size_t>(size()));
  run(Collective::allgather, DataType::int64, ReduceOp::sum, kDesc, -1, 0x300,
      [&](const AlgoOptions& opt) {
        std::random_device rd;
        const std::uint64_t stamp = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
                                    static_cast<std::uint64_t>(::getpid());
        if (count > 0) {
          (void)detail::checked_bytes(count, elem_size, "allocate");
        } else {
          (void)detail::checked_bytes(bytes, 1, "allocate");
        }
        region->create(bytes, stamp);
        mine[1] = share ? region->fd : -1;
        mine[3] = static_cast<std::int64_t>(region->mapped);
        mine[4] = static_cast<std::int64_t>(stamp);
        std::vector<std::size_t> counts(static_cast<std::size_t>(size()), kDesc);
        run_allgather(mine, all.data(), counts, sizeof(std::int64_t), opt);
      });
  for (int r = 0; r < size(); ++r) {
    if (all[kDesc * static_cast<std::size_t>(r) + 2] != static_cast<std::int64_t>(bytes)) {
      // Every rank sees every count: the same error everywhere, without another message.
      std::string list;
      for (int q = 0; q < size(); ++q) {
        list += (q ? ", " : "") + std::to_string(all[kDesc * static_cast<std::size_t>(q) + 2]);
      }
      throw ConfigError("allocate: the ranks asked for different sizes (bytes by rank: " + list +
                        "); every rank must allocate the same count");
    }
  }
  region->peer_base[static_cast<std::size_t>(rank())] = region->base;
  std::uint8_t ok = 1;
  for (int r = 0; r < size() && share; ++r) {
    const std::size_t i = static_cast<std::size_t>(r);
    if (r == rank()) continue;
    const std::int64_t* d = all.data() + kDesc * i;
    if (d[1] < 0 ||
        !region->map_peer(r, static_cast<long>(d[0]), static_cast<long>(d[1]),
                          static_cast<std::size_t>(d[3]), static_cast<std::uint64_t>(d[4]))) {
      ok = 0;
    }
  }
  if (share) {
    // Shared only if every rank mapped every peer: the same answer everywhere. After this
    // collective nobody opens the descriptors any more.
    allreduce(TensorView(&ok, 1, DataType::uint8), ReduceOp::min);
    region->shared = ok != 0;
    if (!region->shared) {
      region->release_peers();
      region->peer_base[static_cast<std::size_t>(rank())] = region->base;
    }
  }
  region->close_fd();
  regions_->add(region);
  return region;
}

template <class T>
void Communicator<T>::check_buffer(const std::shared_ptr<detail::SharedRegion>& r, std::size_t have,
                                   std::size_t want, const char* what) {
  std::string problem;
  if (!r) {
    problem = "the Buffer holds no memory (default-constructed or moved from)";
  } else if (!r->alive) {
    problem =
        "the Buffer was allocated by a communicator that has ended; allocate it again from "
        "the communicator in use";
  } else if (r->owner != regions_.get()) {
    problem = "the Buffer was allocated by another communicator";
  } else if (want > have) {
    problem = "the Buffer holds " + std::to_string(have) + " elements, the collective needs " +
              std::to_string(want);
  }
  if (problem.empty()) return;
  // As any argument error of a collective: the other ranks' matching call fails too instead of
  // waiting (an earlier error of this communicator is thrown instead, as run() would).
  const ConfigError err(std::string(what) + ": " + problem);
  if (transport_->aborted()) transport_->rethrow();
  refuse(err);
  throw err;
}

template <class T>
bool Communicator<T>::try_zero_copy(const TensorView& in, const TensorView& out, ReduceOp op,
                                    const AlgoOptions& opt, BlockSink sink, BlockSource own) {
  if (!regions_ || in.count == 0 || in.bytes() < opts_.zero_copy_bytes) return false;
  detail::SharedRegion* ri = regions_->find(in.data, in.bytes());
  detail::SharedRegion* ro = ri ? regions_->find(out.data, out.bytes()) : nullptr;
  if (!ri || !ro) return false;
  const std::size_t in_off =
      static_cast<std::size_t>(static_cast<const std::byte*>(in.data) - ri->base);
  const std::size_t out_off =
      static_cast<std::size_t>(static_cast<std::byte*>(out.data) - ro->base);
  const std::size_t n = static_cast<std::size_t>(size());
  zc_in_.resize(n);
  zc_out_.resize(n);
  for (std::size_t r = 0; r < n; ++r) {
    zc_in_[r] = ri->peer_base[r] + in_off;
    zc_out_[r] = ro->peer_base[r] + out_off;
  }
  // Every rank must read the same regions at the same offsets, and all must take this path:
  // the barriers' Signature carries both, so a rank that differs (or sends data through the
  // channels instead) is a MismatchError on both sides, not a wrong read.
  AlgoOptions zo = opt;
  std::uint64_t h = 0x7a65726f636f7079ull;  // "zerocopy"
  for (std::uint64_t v :
       {ri->id, ro->id, static_cast<std::uint64_t>(in_off), static_cast<std::uint64_t>(out_off)}) {
    h = (h ^ v) * 0x100000001b3ull;
  }
  zo.sig.extra = h | 1;
  ZeroCopyArgs a;
  a.in = zc_in_;
  a.out = zc_out_;
  a.count = in.count;
  a.dtype = in.dtype;
  a.op = op;
  a.sink = sink;
  a.own = own;
  allreduce_zero_copy(*transport_, a, zo);
  last_zero_copy_ = true;
  return true;
}

}  // namespace kolo
