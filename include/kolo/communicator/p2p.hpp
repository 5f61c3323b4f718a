// kolo/communicator/p2p.hpp — point to point on a Communicator: posting sends and receives
// (checks, their signatures per peer), test and wait.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kolo/communicator.hpp"

namespace kolo {

template <class T>
bool Communicator<T>::test(P2PRequest& r) {
  if (r.done_) return true;
  guard_p2p([&] {
    if (transport_->test(r.req_)) {
      r.done_ = true;
    } else if (r.deadline_.expired()) {
      throw TimeoutError("send/recv: no completion within " +
                         std::to_string(transport_->timeout_seconds()) +
                         " s (did the peer post the matching call?)");
    }
  });
  return r.done_;
}

template <class T>
void Communicator<T>::wait(P2PRequest& r) {
  if (r.done_) return;
  guard_p2p([&] { transport_->wait(r.req_, r.deadline_); });
  r.done_ = true;
}

template <class T>
typename Communicator<T>::P2PRequest Communicator<T>::post(bool is_send, TensorView data, int peer,
                                                           int tag) {
  const char* what = is_send ? "send" : "recv";
  P2PRequest r;
  guard_p2p([&] {
    check_cpu(data, what);
    if (peer < 0 || peer >= size()) {
      throw ConfigError(std::string(what) + ": peer " + std::to_string(peer) +
                        " is not a rank of this communicator (size " + std::to_string(size()) +
                        ")");
    }
    if (peer == rank()) {
      throw ConfigError(std::string(what) + ": peer " + std::to_string(peer) +
                        " is this rank; copy the data locally instead");
    }
    Signature sig;
    sig.collective = Collective::send_recv;
    sig.dtype = data.dtype;
    sig.count = data.count;
    sig.extra = static_cast<std::uint64_t>(static_cast<std::uint32_t>(tag));
    auto& seq = is_send ? p2p_sent_ : p2p_received_;
    if (seq.size() < static_cast<std::size_t>(size())) seq.resize(static_cast<std::size_t>(size()));
    sig.seq = ++seq[static_cast<std::size_t>(peer)];
    r.deadline_ = Deadline::after(transport_->timeout_seconds());
    r.req_ = is_send ? transport_->isend(peer, data.data, data.bytes(), sig)
                     : transport_->irecv(peer, data.data, data.bytes(), sig);
    r.done_ = false;
  });
  return r;
}

}  // namespace kolo
