// kolo/transport/mesh/tcp_channel.hpp — the mesh's TCP route: one authenticated, non-blocking
// socket per peer, with the frame codec (frame_codec.hpp) on top.
//
// This file holds the system calls and nothing else: gather writes of the encoder's header and
// payload ranges (sendmsg, MSG_DONTWAIT), reads into where the decoder says (recv, MSG_DONTWAIT),
// the ABORT a failing rank sends before it shuts its side down, and the drain at close. What the
// bytes mean is the codec's; which operation comes next, completion and errors are the engine's
// (mesh.hpp); the socket was connected and authenticated by mesh/connect.hpp.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/net/socket.hpp"
#include "kolo/transport/mesh/frame_codec.hpp"
#include "kolo/transport/op_pool.hpp"

namespace kolo::detail {

class TcpChannel {
 public:
  enum class Sent { complete, blocked, lost };

  TcpChannel() = default;
  TcpChannel(const TcpChannel&) = delete;
  TcpChannel& operator=(const TcpChannel&) = delete;
  TcpChannel(TcpChannel&& o) noexcept { *this = std::move(o); }
  TcpChannel& operator=(TcpChannel&& o) noexcept {
    std::swap(fd_, o.fd_);
    std::swap(closed_, o.closed_);
    std::swap(want_out_, o.want_out_);
    std::swap(data_waiting_, o.data_waiting_);
    std::swap(error_, o.error_);
    std::swap(enc_, o.enc_);
    std::swap(dec_, o.dec_);
    return *this;
  }
  ~TcpChannel() {
    if (fd_ >= 0) ::close(fd_);
  }

  // Takes over `fd` (connected, authenticated) to rank `peer`; this is rank `self`.
  void open(int fd, int peer, int self, std::size_t frame_bytes) {
    fd_ = fd;
    net::set_nonblocking(fd_, true);
    net::set_nodelay(fd_);
    enc_ = FrameEncoder(frame_bytes);
    dec_ = FrameDecoder(peer, self);
  }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // The peer closed (EOF or reset seen), or we gave up on the connection.
  bool closed() const { return closed_; }
  void mark_closed() { closed_ = true; }
  // The last send hit EAGAIN: wait for POLLOUT.
  bool want_out() const { return want_out_; }
  // A frame for a receive not yet posted is buffered: don't wait for POLLIN until one is (the
  // bytes behind it stay in the kernel, where they cost nothing).
  bool data_waiting() const { return data_waiting_; }
  // errno of the send that returned Sent::lost.
  int error() const { return error_; }

  // Sends as much of `op` as the socket takes.
  Sent push(StreamOp& op) {
    want_out_ = false;
    if (!op.begun) {
      enc_.start(op.bytes, op.sig);
      op.begun = true;
    }
    for (;;) {
      if (enc_.frame_sent()) {
        if (op.done == op.bytes) return Sent::complete;
        enc_.next_data(op.bytes - op.done);
      }
      // A vectored send's runs go in one call too (up to kIov of them).
      constexpr std::size_t kIov = 32;
      iovec iov[kIov + 1];
      int cnt = 0;
      const auto hdr = enc_.header_left();
      if (!hdr.empty()) iov[cnt++] = {const_cast<unsigned char*>(hdr.data()), hdr.size()};
      op.peek_sends(enc_.payload_left(), kIov, [&](const std::byte* p, std::size_t n) {
        iov[cnt++] = {const_cast<std::byte*>(p), n};
      });
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = static_cast<std::size_t>(cnt);
      const ssize_t k = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (k < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          want_out_ = true;
          return Sent::blocked;
        }
        error_ = errno;
        return Sent::lost;
      }
      op.advance(enc_.sent(static_cast<std::size_t>(k)));
    }
  }

  // Receives into the receives of the queue (see FrameDecoder::run): `head()` is the receive at
  // its head or nullptr, `complete()` retires it.
  template <class Head, class Complete>
  FrameDecoder::Stop pull(Head&& head, Complete&& complete) {
    const auto stop =
        dec_.run([this](std::byte* p, std::size_t n) { return read(p, n); }, head, complete,
                 [this](const std::span<std::byte>* runs, std::size_t count) {
                   return read_pieces(runs, count);
                 });
    if (stop == FrameDecoder::Stop::unposted) data_waiting_ = true;
    if (stop == FrameDecoder::Stop::abort) closed_ = true;
    return stop;
  }
  // A receive has been posted: look at the socket again.
  void receive_posted() { data_waiting_ = false; }
  const AbortFrame& abort_received() const { return dec_.abort(); }

  // After a failed send (the peer closed): the ABORT frame the peer sent before it closed, if it
  // is queued at a frame boundary (read out of the kernel now, as far as the buffer takes it).
  std::optional<AbortFrame> queued_abort() {
    if (!dec_.at_frame_boundary()) return std::nullopt;
    for (;;) {
      const auto room = dec_.buffer_space();
      if (room.empty()) break;
      const ssize_t k = ::recv(fd_, room.data(), room.size(), MSG_DONTWAIT);
      if (k > 0) {
        dec_.buffered(static_cast<std::size_t>(k));
        continue;
      }
      if (k < 0 && errno == EINTR) continue;
      break;
    }
    return dec_.queued_abort();
  }

  // Tells the peer why this rank fails: finishes the frame in flight of `in_flight` (bounded), so
  // that the ABORT lands on a frame boundary, sends it and shuts the sending side down. Best
  // effort: if that fails, shuts both sides down (the peer at least sees that we are gone).
  void send_abort(const StreamOp* in_flight, ErrorKind kind, int origin, const std::string& reason,
                  std::uint64_t seq) noexcept {
    const Deadline dl = Deadline::after(0.5);
    try {
      if (in_flight != nullptr && !enc_.frame_sent()) {
        const auto hdr = enc_.header_left();
        net::send_all(fd_, hdr.data(), hdr.size(), dl, "peer");
        const std::size_t payload = enc_.payload_left();
        std::size_t left = payload;
        in_flight->peek_sends(payload, ~std::size_t{0}, [&](const std::byte* p, std::size_t n) {
          net::send_all(fd_, p, n, dl, "peer");
          left -= n;
        });
        if (left > 0) throw Error("the message in flight holds fewer bytes than its frame");
        enc_.sent(hdr.size() + payload);
      }
      const std::vector<unsigned char> frame = encode_abort_frame(kind, origin, reason, seq);
      net::send_all(fd_, frame.data(), frame.size(), dl, "peer");
      ::shutdown(fd_, SHUT_WR);
    } catch (...) {
      ::shutdown(fd_, SHUT_RDWR);
    }
  }

 private:
  FrameDecoder::ReadResult read(std::byte* p, std::size_t n) {
    if (closed_) return {0, true};
    for (;;) {
      const ssize_t k = ::recv(fd_, p, n, MSG_DONTWAIT);
      if (k > 0) return {static_cast<std::size_t>(k), false};
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return {0, false};
      closed_ = true;  // EOF or reset: an error only if an operation still needs this peer
      return {0, true};
    }
  }

  // read() into several runs with one call (recvmsg, not blocking, as read()'s recv).
  FrameDecoder::ReadResult read_pieces(const std::span<std::byte>* runs, std::size_t count) {
    if (closed_) return {0, true};
    iovec iov[FrameDecoder::kPieceReads];
    count = std::min(count, FrameDecoder::kPieceReads);
    for (std::size_t i = 0; i < count; ++i) iov[i] = {runs[i].data(), runs[i].size()};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    for (;;) {
      const ssize_t k = ::recvmsg(fd_, &msg, MSG_DONTWAIT);
      if (k > 0) return {static_cast<std::size_t>(k), false};
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return {0, false};
      closed_ = true;  // EOF or reset, as read()
      return {0, true};
    }
  }

  int fd_ = -1;
  bool closed_ = false;
  bool want_out_ = false;
  bool data_waiting_ = false;
  int error_ = 0;
  FrameEncoder enc_;
  FrameDecoder dec_;
};

// drain_before_close and BackgroundDrains, which a transport uses after an abort, are in
// transport/detail/mesh_impl.hpp.

}  // namespace kolo::detail
