// kolo/engine/timeline.hpp — a Chrome-trace JSON timeline (KOLO_TIMELINE=path), loadable in
// Perfetto or chrome://tracing.
//
// The engine thread only appends small event records to a vector under a mutex; a writer thread
// formats and writes them, so the file system never stalls negotiation. Each tensor gets its own
// track (tid), named after the tensor, and its phases appear as complete ("X") events:
// NEGOTIATE, QUEUE, PACK, the collective (ALLREDUCE, ALLGATHER, BROADCAST), UNPACK. An event
// carries its track's number, not the tensor's name: the name travels once, when the track is
// first used, so recording allocates nothing per event (the event vectors keep their capacity).
#pragma once

#include <charconv>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"

namespace kolo {

class Timeline {
 public:
  using clock = std::chrono::steady_clock;

  Timeline() = default;
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  ~Timeline() { close(); }

  void open(const std::string& path, int rank);

  bool enabled() const { return file_ != nullptr; }

  // The track of a tensor: a number, the same for the same name for the life of the timeline
  // (the caller may keep it). Called by the recording thread only.
  int track(std::string_view tensor) {
    if (!file_) return 0;
    auto it = track_ids_.find(tensor);
    if (it != track_ids_.end()) return it->second;
    const int id = static_cast<int>(track_ids_.size()) + 1;
    track_ids_.emplace(std::string(tensor), id);
    Event e;
    e.track = id;
    e.name = std::string(tensor);  // phase == nullptr: names the track for the writer
    staging_.push_back(std::move(e));
    return id;
  }

  // A phase of one tensor (its track()), from `begin` to `end`. Called by one thread only (the
  // engine's): events collect in a staging vector without a lock and reach the writer in
  // batches (publish(), once per engine cycle, or every 4096 events).
  void record(int track, const char* phase, clock::time_point begin, clock::time_point end,
              DataType dtype, std::size_t bytes) {
    if (!file_) return;
    Event e;
    e.track = track;
    e.phase = phase;
    e.begin = begin;
    e.end = end;
    e.dtype = dtype;
    e.bytes = bytes;
    staging_.push_back(std::move(e));
    if (staging_.size() >= 4096) publish();
  }
  void record(std::string_view tensor, const char* phase, clock::time_point begin,
              clock::time_point end, DataType dtype, std::size_t bytes) {
    if (!file_) return;
    record(track(tensor), phase, begin, end, dtype, bytes);
  }

  // Hands the staged events to the writer thread (woken only for large batches; otherwise its
  // 200 ms clock picks them up — fewer wake-ups, less CPU taken from the ranks).
  void publish();

  void close();

 private:
  struct Event {
    int track = 0;
    const char* phase = nullptr;  // nullptr: a new track, `name` is its tensor
    clock::time_point begin, end;
    DataType dtype = DataType::uint8;
    std::size_t bytes = 0;
    std::string name;
  };
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const noexcept {
      return std::hash<std::string_view>{}(s);
    }
  };

  void run();

  static std::string escape(const std::string& s);

  // Microseconds with three decimals from nanoseconds, without floating point or printf: the
  // writer formats every event of every tensor (5 per tensor per step), and on a machine with
  // fewer cores than ranks its CPU time is taken from the ranks.
  static void append_us(std::string& out, std::int64_t ns);
  static void append_int(std::string& out, std::uint64_t v);

  void write(const Event& e);

  std::FILE* file_ = nullptr;
  int rank_ = 0;
  clock::time_point start_;
  std::thread writer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;   // published, for the writer (under mu_)
  std::vector<Event> staging_;  // the recording thread's, not yet published
  bool stop_ = false;
  std::unordered_map<std::string, int, NameHash, std::equal_to<>> track_ids_;  // recording side
  std::vector<std::string> tracks_;  // writer side: line prefix by track
  std::string line_;
};

}  // namespace kolo

// Header-only: the writer's definitions, inline (compiled core: in the library,
// src/lib/core_impl.cpp).
#if !KOLO_USE_COMPILED_CORE
#include "kolo/engine/detail/timeline_impl.hpp"
#endif
