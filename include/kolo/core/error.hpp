// kolo/core/error.hpp — the error hierarchy every layer throws.
//
// Users catch kolo::Error for "anything from kolo", or a subclass to react to one kind of fault:
// TimeoutError (a deadline passed), PeerLostError (a rank died or closed its connection),
// MismatchError (ranks called a collective with different arguments), ConfigError (a bad
// environment variable or option), RevokedError (a rank revoked the communicator, e.g. to shrink
// it after a failure). Messages name what is wrong so a user can act on them.
#pragma once

#include <stdexcept>
#include <string>

namespace kolo {

// Numeric codes travel on the wire when one rank aborts the others (the kind is preserved).
// Append only: the numbers are on the wire.
enum class ErrorKind : int {
  generic = 1,
  timeout = 2,
  peer_lost = 3,
  mismatch = 4,
  config = 5,
  revoked = 6
};

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorKind kind = ErrorKind::generic)
      : std::runtime_error(what), kind_(kind) {}
  ErrorKind kind() const noexcept { return kind_; }

 private:
  ErrorKind kind_;
};

class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what, ErrorKind::timeout) {}
};

class PeerLostError : public Error {
 public:
  explicit PeerLostError(const std::string& what) : Error(what, ErrorKind::peer_lost) {}
};

class MismatchError : public Error {
 public:
  // tensor: for a list of tensors (Engine::allreduce_coalesced_async) whose element counts differ
  // between ranks, the index of the first tensor that differs; -1 when the error is not about
  // one tensor of a list.
  explicit MismatchError(const std::string& what, long tensor = -1)
      : Error(what, ErrorKind::mismatch), tensor_(tensor) {}
  // The index of the list's first tensor whose element count differs between ranks, or -1.
  long tensor_index() const noexcept { return tensor_; }

 private:
  long tensor_;
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what, ErrorKind::config) {}
};

// A rank revoked the communicator (Communicator::revoke, or shrink, which revokes the parent
// first): every pending and later operation on it fails with this error on every rank. A sibling
// of PeerLostError, not a subclass: a revocation may be a decision with nobody dead. When a peer
// was lost first, operations keep failing with the PeerLostError that caused the revocation.
class RevokedError : public Error {
 public:
  explicit RevokedError(const std::string& what) : Error(what, ErrorKind::revoked) {}
};

// True for the errors a survivor can recover from by shrinking the communicator (a peer lost, the
// communicator revoked, a deadline passed); false for wrong arguments and configuration.
inline bool recoverable(const Error& e) noexcept {
  return e.kind() == ErrorKind::peer_lost || e.kind() == ErrorKind::revoked ||
         e.kind() == ErrorKind::timeout;
}

// Re-raises an error received from another rank with its original kind.
[[noreturn]] inline void throw_error(ErrorKind kind, const std::string& what) {
  switch (kind) {
    case ErrorKind::timeout:
      throw TimeoutError(what);
    case ErrorKind::peer_lost:
      throw PeerLostError(what);
    case ErrorKind::mismatch:
      throw MismatchError(what);
    case ErrorKind::config:
      throw ConfigError(what);
    case ErrorKind::revoked:
      throw RevokedError(what);
    case ErrorKind::generic:
      break;
  }
  throw Error(what);
}

// Name of the exception class for an error kind, used in messages and logs.
inline const char* error_kind_name(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::timeout:
      return "TimeoutError";
    case ErrorKind::peer_lost:
      return "PeerLostError";
    case ErrorKind::mismatch:
      return "MismatchError";
    case ErrorKind::config:
      return "ConfigError";
    case ErrorKind::revoked:
      return "RevokedError";
    case ErrorKind::generic:
      break;
  }
  return "Error";
}

}  // namespace kolo
