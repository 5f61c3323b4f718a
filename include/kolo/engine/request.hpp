// kolo/engine/request.hpp — what a rank says about a named tensor during negotiation, and its
// wire format (a length-prefixed byte string, gathered from every rank).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

enum class OpKind : std::uint8_t { allreduce = 1, allgather = 2, broadcast = 3 };

// What ReduceOp::average divides by while some ranks have joined (Engine::join): the number of
// ranks (joined ranks count as zeros: Horovod's behaviour and DDP's default), or the number of
// ranks that contributed a tensor (DDP's divide_by_initial_world_size=False).
enum class JoinAverage : std::uint8_t { world_size = 0, active_ranks = 1 };

inline const char* join_average_name(JoinAverage j) {
  return j == JoinAverage::active_ranks ? "active" : "world";
}

// KOLO_JOIN_AVERAGE: "world" (default) or "active".
inline JoinAverage parse_join_average(const std::string& v) {
  if (v.empty() || v == "world" || v == "world_size") return JoinAverage::world_size;
  if (v == "active" || v == "active_ranks") return JoinAverage::active_ranks;
  throw ConfigError("KOLO_JOIN_AVERAGE=" + v +
                    " is not one of world (divide by the number of ranks), active (divide by "
                    "the ranks that have not joined)");
}

inline const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::allreduce:
      return "allreduce";
    case OpKind::allgather:
      return "allgather";
    case OpKind::broadcast:
      return "broadcast";
  }
  return "unknown";
}

struct RequestParams {
  OpKind kind = OpKind::allreduce;
  DataType dtype = DataType::float32;
  ReduceOp op = ReduceOp::sum;
  std::int32_t root = -1;
  std::uint64_t count = 0;
  double prescale = 1.0;
  double postscale = 1.0;
  std::string group;  // grouped allreduce: members execute together, atomically
  std::uint32_t group_size = 0;
  std::uint8_t device = 0;  // 0: host memory, 1: CUDA device memory (must agree across ranks)
  // A coalesced submission (Engine::allreduce_coalesced_async): its tensors' counts, in order
  // (count is their sum). Empty for a single tensor. Every rank must pass the same list.
  std::vector<std::uint64_t> parts;
  // Average only (world_size otherwise): ranks that disagree get a MismatchError.
  JoinAverage join_average = JoinAverage::world_size;

  friend bool operator==(const RequestParams&, const RequestParams&) = default;

  std::string describe() const {
    std::string s = std::string(op_kind_name(kind)) + "(" + std::to_string(count) + " x " +
                    std::string(dtype_name(dtype));
    if (kind == OpKind::allreduce) s += ", " + std::string(reduce_op_name(op));
    if (kind == OpKind::broadcast) s += ", root " + std::to_string(root);
    if (prescale != 1.0) s += ", prescale " + std::to_string(prescale);
    if (postscale != 1.0) s += ", postscale " + std::to_string(postscale);
    if (join_average == JoinAverage::active_ranks) s += ", divided by the active ranks";
    if (!group.empty()) s += ", group '" + group + "'";
    if (!parts.empty()) s += ", " + std::to_string(parts.size()) + " tensors coalesced";
    if (device != 0) s += ", on a CUDA device";
    return s + ")";
  }
};

struct WireRequest {
  std::string name;
  RequestParams p;
};

namespace detail {

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
inline void put_str(std::string& out, const std::string& s) {
  put(out, static_cast<std::uint32_t>(s.size()));
  out += s;
}
template <class T>
T take(const std::string& in, std::size_t& pos) {
  if (pos + sizeof(T) > in.size()) throw Error("engine: truncated negotiation message");
  T v;
  std::memcpy(&v, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}
inline std::string take_str(const std::string& in, std::size_t& pos) {
  const auto n = take<std::uint32_t>(in, pos);
  if (pos + n > in.size()) throw Error("engine: truncated negotiation message");
  std::string s = in.substr(pos, n);
  pos += n;
  return s;
}

}  // namespace detail

inline void serialize(std::string& out, const WireRequest& r) {
  detail::put_str(out, r.name);
  detail::put(out, static_cast<std::uint8_t>(r.p.kind));
  detail::put(out, static_cast<std::uint8_t>(r.p.dtype));
  detail::put(out, static_cast<std::uint8_t>(r.p.op));
  detail::put(out, r.p.root);
  detail::put(out, r.p.count);
  detail::put(out, r.p.prescale);
  detail::put(out, r.p.postscale);
  detail::put_str(out, r.p.group);
  detail::put(out, r.p.group_size);
  detail::put(out, r.p.device);
  detail::put(out, static_cast<std::uint8_t>(r.p.join_average));
  detail::put(out, static_cast<std::uint64_t>(r.p.parts.size()));
  for (std::uint64_t c : r.p.parts) detail::put(out, c);
}

inline std::vector<WireRequest> deserialize_requests(const std::string& in) {
  std::vector<WireRequest> out;
  std::size_t pos = 0;
  while (pos < in.size()) {
    WireRequest r;
    r.name = detail::take_str(in, pos);
    r.p.kind = static_cast<OpKind>(detail::take<std::uint8_t>(in, pos));
    r.p.dtype = static_cast<DataType>(detail::take<std::uint8_t>(in, pos));
    r.p.op = static_cast<ReduceOp>(detail::take<std::uint8_t>(in, pos));
    r.p.root = detail::take<std::int32_t>(in, pos);
    r.p.count = detail::take<std::uint64_t>(in, pos);
    r.p.prescale = detail::take<double>(in, pos);
    r.p.postscale = detail::take<double>(in, pos);
    r.p.group = detail::take_str(in, pos);
    r.p.group_size = detail::take<std::uint32_t>(in, pos);
    r.p.device = detail::take<std::uint8_t>(in, pos);
    r.p.join_average = static_cast<JoinAverage>(detail::take<std::uint8_t>(in, pos));
    const auto parts = detail::take<std::uint64_t>(in, pos);
    if (parts > (in.size() - pos) / sizeof(std::uint64_t)) {
      throw Error("engine: truncated negotiation message");
    }
    r.p.parts.resize(static_cast<std::size_t>(parts));
    for (auto& c : r.p.parts) c = detail::take<std::uint64_t>(in, pos);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace kolo
