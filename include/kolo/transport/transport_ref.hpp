// kolo/transport/transport_ref.hpp — TransportRef: any Transport behind one small table of
// function pointers, so the algorithms are ordinary functions instead of templates.
//
// Every algorithm (algorithm/*.hpp) takes a TransportRef. A TransportRef is two pointers and two
// ints: the transport object, a table with one entry per call of the Transport contract
// (transport.hpp), and the rank and size it answers without a call. It is built implicitly from
// any `T&` that models Transport, so `allreduce_ring(mesh, ...)` still reads as before, and a
// GroupView (a subset of ranks) is a TransportRef with a rank map. Requests are erased to a
// 16-byte value (TransportRef::Request); the table converts them back.
//
// Why: an algorithm written against TransportRef is compiled once, not once per transport and
// once more per GroupView<transport> — what a compiled core can hold, and what keeps the
// headers cheap to compile — while the reduction kernels stay templated on the element type
// (core/reduce.hpp), where templates buy speed. The cost is one indirect call per posted or
// tested operation: nanoseconds against the microseconds a message takes (docs/architecture.md
// has the before/after measurement).
//
// A TransportRef does not own the transport; it must not outlive it (nor, for a group, the
// GroupView it came from).
#pragma once

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "kolo/core/deadline.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/signature.hpp"
#include "kolo/transport/transport.hpp"

namespace kolo {

class TransportRef {
 public:
  // A transport's Request, erased: the bytes of T::Request (at most kMaxRequestBytes).
  struct Request {
    alignas(8) unsigned char bytes[kMaxRequestBytes] = {};
  };

  // One entry per call of the contract; `self` is the transport object.
  struct VTable {
    Request (*isend)(void* self, int peer, const void* src, std::size_t bytes,
                     const Signature& sig);
    Request (*irecv)(void* self, int peer, void* dst, std::size_t bytes, const Signature& sig);
    Request (*irecv_reduce)(void* self, int peer, void* dst, const void* local, std::size_t bytes,
                            const ReduceSpec& rs, const Signature& sig);
    bool (*done)(const void* self, const Request& r);
    bool (*test)(void* self, const Request& r);
    void (*wait)(void* self, const Request& r, const Deadline& dl);
    void (*wait_any_progress)(void* self, const Deadline& dl);
    void (*abort)(void* self, const Error& err);
    bool (*aborted)(const void* self);
    void (*rethrow)(const void* self);
    double (*timeout_seconds)(const void* self);
    // VectoredP2P (transport.hpp); nullptr when the transport has none.
    Request (*isendv)(void* self, int peer, const IoPiece* pieces, std::size_t count,
                      std::size_t bytes, const Signature& sig);
    Request (*irecvv)(void* self, int peer, const IoPiece* pieces, std::size_t count,
                      std::size_t bytes, const Signature& sig);
    Request (*irecv_reducev)(void* self, int peer, const IoPiece* pieces, std::size_t count,
                             std::size_t bytes, const ReduceSpec& rs, const Signature& sig);
  };

  // The table of transport type T (one per type, built at compile time).
  template <class T>
  static const VTable vtable_of;

  // Any Transport, by reference (implicit: algorithms take a TransportRef, callers pass theirs).
  template <class T>
  requires(!std::is_same_v<std::remove_cv_t<T>, TransportRef> && Transport<T>) TransportRef(T& t)
  noexcept  // NOLINT(google-explicit-constructor)
      : self_(&t), vt_(&vtable_of<T>), rank_(t.rank()), size_(t.size()) {}

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The underlying transport's rank of rank p of this reference (p itself unless a group).
  int global(int p) const { return map_ != nullptr ? map_[p] : p; }

  Request isend(int peer, const void* src, std::size_t bytes, const Signature& sig) {
    return vt_->isend(self_, global(peer), src, bytes, sig);
  }
  Request irecv(int peer, void* dst, std::size_t bytes, const Signature& sig) {
    return vt_->irecv(self_, global(peer), dst, bytes, sig);
  }
  Request irecv_reduce(int peer, void* dst, const void* local, std::size_t bytes,
                       const ReduceSpec& rs, const Signature& sig) {
    return vt_->irecv_reduce(self_, global(peer), dst, local, bytes, rs, sig);
  }
  // Whether the transport takes messages in pieces (VectoredP2P); the three calls below need it.
  bool vectored() const { return vt_->isendv != nullptr; }
  Request isendv(int peer, const IoPiece* pieces, std::size_t count, std::size_t bytes,
                 const Signature& sig) {
    return vt_->isendv(self_, global(peer), pieces, count, bytes, sig);
  }
  Request irecvv(int peer, const IoPiece* pieces, std::size_t count, std::size_t bytes,
                 const Signature& sig) {
    return vt_->irecvv(self_, global(peer), pieces, count, bytes, sig);
  }
  Request irecv_reducev(int peer, const IoPiece* pieces, std::size_t count, std::size_t bytes,
                        const ReduceSpec& rs, const Signature& sig) {
    return vt_->irecv_reducev(self_, global(peer), pieces, count, bytes, rs, sig);
  }
  bool done(const Request& r) const { return vt_->done(self_, r); }
  bool test(const Request& r) { return vt_->test(self_, r); }
  void wait(const Request& r, const Deadline& dl) { vt_->wait(self_, r, dl); }
  void wait_any_progress(const Deadline& dl) { vt_->wait_any_progress(self_, dl); }
  // An error in a group is an error of the whole job: the transport tells every rank.
  void abort(const Error& err) { vt_->abort(self_, err); }
  bool aborted() const { return vt_->aborted(self_); }
  [[noreturn]] void rethrow() const {
    vt_->rethrow(self_);
    throw Error("transport: rethrow() returned without an error to throw");
  }
  double timeout_seconds() const { return vt_->timeout_seconds(self_); }

 private:
  friend class GroupView;

  template <class T>
  static Request wrap(const typename T::Request& r) {
    static_assert(std::is_trivially_copyable_v<typename T::Request> &&
                  sizeof(typename T::Request) <= kMaxRequestBytes);
    Request out;
    std::memcpy(out.bytes, &r, sizeof(r));
    return out;
  }
  template <class T>
  static constexpr auto isendv_of() {
    using Fn = Request (*)(void*, int, const IoPiece*, std::size_t, std::size_t, const Signature&);
    if constexpr (VectoredP2P<T>) {
      return Fn{
          [](void* s, int p, const IoPiece* v, std::size_t c, std::size_t b, const Signature& g) {
            return wrap<T>(static_cast<T*>(s)->isendv(p, v, c, b, g));
          }};
    } else {
      return Fn{nullptr};
    }
  }
  template <class T>
  static constexpr auto irecvv_of() {
    using Fn = Request (*)(void*, int, const IoPiece*, std::size_t, std::size_t, const Signature&);
    if constexpr (VectoredP2P<T>) {
      return Fn{
          [](void* s, int p, const IoPiece* v, std::size_t c, std::size_t b, const Signature& g) {
            return wrap<T>(static_cast<T*>(s)->irecvv(p, v, c, b, g));
          }};
    } else {
      return Fn{nullptr};
    }
  }
  template <class T>
  static constexpr auto irecv_reducev_of() {
    using Fn = Request (*)(void*, int, const IoPiece*, std::size_t, std::size_t, const ReduceSpec&,
                           const Signature&);
    if constexpr (VectoredP2P<T>) {
      return Fn{[](void* s, int p, const IoPiece* v, std::size_t c, std::size_t b,
                   const ReduceSpec& rs, const Signature& g) {
        return wrap<T>(static_cast<T*>(s)->irecv_reducev(p, v, c, b, rs, g));
      }};
    } else {
      return Fn{nullptr};
    }
  }
  template <class T>
  static typename T::Request unwrap(const Request& r) {
    typename T::Request out;
    std::memcpy(&out, r.bytes, sizeof(out));
    return out;
  }

  void* self_;
  const VTable* vt_;
  const int* map_ = nullptr;  // group rank -> underlying rank (GroupView); nullptr: identity
  int rank_;
  int size_;
};

template <class T>
constexpr TransportRef::VTable TransportRef::vtable_of{
    [](void* s, int p, const void* src, std::size_t b, const Signature& g) {
      return wrap<T>(static_cast<T*>(s)->isend(p, src, b, g));
    },
    [](void* s, int p, void* dst, std::size_t b, const Signature& g) {
      return wrap<T>(static_cast<T*>(s)->irecv(p, dst, b, g));
    },
    [](void* s, int p, void* dst, const void* local, std::size_t b, const ReduceSpec& rs,
       const Signature& g) {
      return wrap<T>(static_cast<T*>(s)->irecv_reduce(p, dst, local, b, rs, g));
    },
    [](const void* s, const Request& r) { return static_cast<const T*>(s)->done(unwrap<T>(r)); },
    [](void* s, const Request& r) { return static_cast<T*>(s)->test(unwrap<T>(r)); },
    [](void* s, const Request& r, const Deadline& dl) {
      static_cast<T*>(s)->wait(unwrap<T>(r), dl);
    },
    [](void* s, const Deadline& dl) { static_cast<T*>(s)->wait_any_progress(dl); },
    [](void* s, const Error& e) { static_cast<T*>(s)->abort(e); },
    [](const void* s) { return static_cast<const T*>(s)->aborted(); },
    [](const void* s) { static_cast<const T*>(s)->rethrow(); },
    [](const void* s) { return static_cast<double>(static_cast<const T*>(s)->timeout_seconds()); },
    isendv_of<T>(),
    irecvv_of<T>(),
    irecv_reducev_of<T>(),
};

static_assert(check_transport<TransportRef>());

}  // namespace kolo
