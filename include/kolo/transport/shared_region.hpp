// kolo/transport/shared_region.hpp — memory that every rank of one host maps: the storage of
// kolo::Buffer (Communicator::allocate) and of the engine's fusion buffer, which the zero-copy
// allreduce (algorithm/allreduce_zero_copy.hpp) reads in place.
//
// Each rank creates its region as an anonymous memfd and maps it; the local peers open it
// through /proc/<pid>/fd/<fd> and map it too, and check the random stamp in its first page (a
// process id read in another PID namespace could name another process: then nothing is shared).
// Nothing has a name in /dev/shm, so a rank killed at any moment leaks nothing: the pages go when
// the last mapping does. The owner closes its descriptor once every peer has mapped
// (Communicator::allocate is collective), and the mappings live as long as the Buffer (its own) or
// the Communicator (the peers').
//
// Why memfd and /proc rather than the mesh's named segments (shm_channel.hpp): a fusion buffer
// is large (the fusion threshold, 128 MiB by default) and /dev/shm is often small (64 MiB in a
// default container); a memfd is bounded only by memory, and its pages are committed when
// touched, not when created.
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kolo/core/error.hpp"
#include "kolo/net/socket.hpp"

namespace kolo {

namespace detail {

class RegionRegistry;

// One rank's region and, once shared, where every local peer's region of the same allocation
// lies in this process.
struct SharedRegion {
  std::byte* base = nullptr;  // this rank's memory: `bytes`, after one header page
  std::size_t bytes = 0;
  std::size_t mapped = 0;   // header page + bytes, page-rounded
  std::uint64_t nonce = 0;  // written in the header: a peer checks it mapped the right file
  int fd = -1;              // the memfd until the peers have mapped it
  std::uint64_t id = 0;     // allocation number in its communicator: the same on every rank
  bool shared = false;      // every peer mapped it: the zero-copy allreduce may read it
  bool alive = true;        // its communicator still exists
  const RegionRegistry* owner = nullptr;
  std::vector<std::byte*> peer_base;     // by rank; this rank's own base at its index
  std::vector<std::size_t> peer_mapped;  // lengths to unmap

  SharedRegion() = default;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;
  ~SharedRegion() {
    release_peers();
    if (base) ::munmap(base - page_bytes(), mapped);
    if (fd >= 0) ::close(fd);
  }

  static std::size_t page_bytes() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

  // Creates this rank's memory: a memfd when the system has one, else private anonymous memory
  // (a Buffer that works, reduced through the channels). The first page holds `nonce`.
  void create(std::size_t n, std::uint64_t stamp) {
    bytes = n;
    nonce = stamp;
    const std::size_t page = page_bytes();
    mapped = page + std::max<std::size_t>(page, (n + page - 1) / page * page);
#ifdef MFD_CLOEXEC
    fd = ::memfd_create("kolo-buffer", MFD_CLOEXEC);
#endif
    if (fd >= 0 && ::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      ::close(fd);
      fd = -1;
    }
    void* p = fd >= 0 ? ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                      : ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                               -1, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      if (fd >= 0) ::close(fd);
      fd = -1;
      throw Error("cannot allocate a kolo buffer of " + std::to_string(n) +
                  " bytes: " + net::errno_text(err));
    }
    std::memcpy(p, &nonce, sizeof(nonce));
    base = static_cast<std::byte*>(p) + page;
  }

  // Maps peer `rank`'s region (process `pid`, descriptor `peer_fd`, `len` bytes mapped, stamped
  // `peer_nonce`); false when the system does not let this process open it, or what it opened
  // is not that region (a process id of another PID namespace, say).
  bool map_peer(int rank, long pid, long peer_fd, std::size_t len, std::uint64_t peer_nonce) {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(peer_fd);
    const int f = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (f < 0) return false;
    struct stat st {};
    if (::fstat(f, &st) != 0 || static_cast<std::size_t>(st.st_size) < len) {
      ::close(f);
      return false;
    }
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    ::close(f);
    if (p == MAP_FAILED) return false;
    std::uint64_t seen = 0;
    std::memcpy(&seen, p, sizeof(seen));
    if (seen != peer_nonce) {
      ::munmap(p, len);
      return false;
    }
    peer_base[static_cast<std::size_t>(rank)] = static_cast<std::byte*>(p) + page_bytes();
    peer_mapped[static_cast<std::size_t>(rank)] = len;
    return true;
  }

  void close_fd() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }

  // Unmaps the peers' regions (the communicator ends, or sharing failed somewhere).
  void release_peers() {
    for (std::size_t r = 0; r < peer_base.size(); ++r) {
      if (peer_base[r] && peer_base[r] != base) {
        ::munmap(peer_base[r] - page_bytes(), peer_mapped[r]);
      }
      peer_base[r] = nullptr;
    }
    shared = false;
  }
};

// A communicator's regions, for finding which one (if any) holds a pointer. Ends with the
// communicator: its regions are marked dead and their peers' mappings dropped, while each
// Buffer keeps its own memory.
class RegionRegistry {
 public:
  RegionRegistry() = default;
  RegionRegistry(const RegionRegistry&) = delete;
  RegionRegistry& operator=(const RegionRegistry&) = delete;
  ~RegionRegistry() {
    for (auto& w : regions_) {
      if (auto r = w.lock()) {
        r->alive = false;
        r->release_peers();
      }
    }
  }

  std::uint64_t next_id() { return next_id_++; }
  void add(const std::shared_ptr<SharedRegion>& r) {
    std::erase_if(regions_, [](const std::weak_ptr<SharedRegion>& w) { return w.expired(); });
    regions_.push_back(r);
  }

  // The shared region holding [p, p + n), or nullptr.
  SharedRegion* find(const void* p, std::size_t n) const {
    const auto* b = static_cast<const std::byte*>(p);
    for (const auto& w : regions_) {
      auto r = w.lock();
      if (r && r->shared && b >= r->base && b + n <= r->base + r->bytes) return r.get();
    }
    return nullptr;
  }

 private:
  std::vector<std::weak_ptr<SharedRegion>> regions_;
  std::uint64_t next_id_ = 0;
};

}  // namespace detail

// Memory for `count` elements of E that the local peers of its communicator map
// (Communicator::allocate). A collective on a Buffer of a communicator whose ranks are all on
// one shared-memory host reads the peers' Buffers in place (the zero-copy allreduce); elsewhere
// it is ordinary memory. A contiguous range: comm.allreduce(buf), std::span<E>(buf), buf[i].
// Movable, not copyable; the memory lives as long as the Buffer, even past its communicator
// (but a collective on it then is an error).
template <class E>
class Buffer {
 public:
  Buffer() = default;

  E* data() const { return region_ ? reinterpret_cast<E*>(region_->base) : nullptr; }
  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  E* begin() const { return data(); }
  E* end() const { return data() + count_; }
  E& operator[](std::size_t i) const { return data()[i]; }
  std::span<E> span() const { return {data(), count_}; }
  // Every local peer maps it: collectives on it take the zero-copy path.
  bool shared() const { return region_ && region_->shared; }
  // Its communicator still exists.
  bool valid() const { return region_ && region_->alive; }

  // The first `count` elements, sharing this Buffer's memory (for a collective on a prefix:
  // comm.allreduce(buf.first(n))). More than size() is a ConfigError naming both.
  Buffer first(std::size_t count) const {
    if (count > count_) {
      throw ConfigError("Buffer::first(" + std::to_string(count) + "): the Buffer holds " +
                        std::to_string(count_) + " elements");
    }
    return Buffer(region_, count);
  }

  // The region behind it (Communicator's business).
  const std::shared_ptr<detail::SharedRegion>& region() const { return region_; }
  Buffer(std::shared_ptr<detail::SharedRegion> r, std::size_t count)
      : region_(std::move(r)), count_(count) {}

 private:
  std::shared_ptr<detail::SharedRegion> region_;
  std::size_t count_ = 0;
};

namespace detail {
template <class T>
inline constexpr bool is_buffer_v = false;
template <class E>
inline constexpr bool is_buffer_v<Buffer<E>> = true;
}  // namespace detail

}  // namespace kolo
