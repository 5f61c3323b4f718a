// kolo/transport/mpi/wire.hpp — what MpiTransport puts on the wire and what MPI holds pointers
// into: the 48-byte message header, the control message (abort, goodbye), and the kolo-owned
// buffers of point-to-point operations and native collectives. Protocol: transport/mpi.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "kolo/core/signature.hpp"
#include "kolo/transport/mpi/runtime.hpp"
#include "kolo/transport/op_pool.hpp"

namespace kolo::detail::mpi {

inline constexpr std::uint32_t kHeaderMagic = 0x4b4d5031;   // "KMP1"
inline constexpr std::uint32_t kControlMagic = 0x4b4d5043;  // "KMPC"
inline constexpr std::uint32_t kControlAbort = 1;
inline constexpr std::uint32_t kControlGoodbye = 2;
inline constexpr std::size_t kMaxMessage = std::size_t{1} << 30;  // MPI counts are ints

struct WireHeader {
  std::uint32_t magic;
  std::uint32_t inline_payload;  // 1: the payload follows in this message
  std::uint64_t bytes;
  Signature sig;
};
static_assert(sizeof(WireHeader) == 48);

struct ControlMessage {
  std::uint32_t magic = kControlMagic;
  std::uint32_t type = 0;
  std::uint64_t token = 0;  // which transport instance (stale messages are ignored)
  std::int32_t kind = 0;    // abort: ErrorKind
  std::int32_t origin = -1;
  std::uint64_t sent_to_you = 0;        // goodbye: messages sent to the receiver
  std::uint64_t received_from_you = 0;  // goodbye: messages received from the receiver
  std::uint64_t collectives_done = 0;   // goodbye: native collectives completed
  std::uint64_t seq = 0;                // abort: the call it belongs to (RemoteAbort::seq)
  char reason[2048] = {};
};
inline constexpr std::size_t kControlHeaderBytes = offsetof(ControlMessage, reason);

// A point-to-point operation as MPI carries it: a header message (with the payload inline when
// small) and, for a large payload, data messages from or into a kolo-owned staging copy.
struct MpiOp : P2POp {
  bool header_done = false;
  bool inline_payload = false;
  MPI_Request head = MPI_REQUEST_NULL;
  std::vector<MPI_Request> data;  // payload messages of a large op (1 GiB each at most)
  std::size_t data_done = 0;
  std::vector<std::byte> wire;     // header (+ inline payload), owned: MPI reads/writes it
  std::vector<std::byte> staging;  // large payloads: kolo-owned copy sent, or landing zone
};

// What non-blocking native collectives read and write: kolo's, not the caller's, so that a
// collective abandoned after an error (it cannot be cancelled) never touches the caller's memory
// again; on abandonment the whole set is buried and replaced.
struct NativeBuffers {
  std::vector<std::byte> in, out;
  std::vector<Signature> sigs;
};

// A closed transport's state that pending MPI requests still point into.
struct Leftovers {
  std::deque<MpiOp> ops;
  std::unique_ptr<ControlMessage> control_in;
  std::vector<std::unique_ptr<ControlMessage>> control_out;
};

}  // namespace kolo::detail::mpi
