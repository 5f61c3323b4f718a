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

  void open(const std::string& path, int rank) {
    file_ = std::fopen(path.c_str(), "w");
    if (!file_) throw ConfigError("KOLO_TIMELINE=" + path + " cannot be opened for writing");
    rank_ = rank;
    start_ = clock::now();
    std::fputs("[\n", file_);
    writer_ = std::thread([this] { run(); });
  }

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
  void publish() {
    if (!file_ || staging_.empty()) return;
    bool wake = false;
    {
      std::lock_guard lock(mu_);
      if (events_.empty()) {
        events_.swap(staging_);
      } else {
        events_.insert(events_.end(), std::make_move_iterator(staging_.begin()),
                       std::make_move_iterator(staging_.end()));
        staging_.clear();
      }
      wake = events_.size() >= 8192;
    }
    if (wake) cv_.notify_one();
  }

  void close() {
    if (!file_) return;
    publish();
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    writer_.join();
    std::fputs("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", file_);
    std::fprintf(file_, "%d,\"args\":{\"name\":\"kolo rank %d\"}}\n]\n", rank_, rank_);
    std::fclose(file_);
    file_ = nullptr;
  }

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

  void run() {
    std::vector<Event> batch;
    for (;;) {
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(200),
                     [&] { return stop_ || !events_.empty(); });
        batch.swap(events_);
        if (batch.empty() && stop_) return;
      }
      for (const Event& e : batch) write(e);
      batch.clear();
      std::fflush(file_);
    }
  }

  static std::string escape(const std::string& s) {
    std::string out;
    for (char c : s) {
      if (c == '"' || c == '\\') out.push_back('\\');
      if (static_cast<unsigned char>(c) < 0x20) continue;
      out.push_back(c);
    }
    return out;
  }

  // Microseconds with three decimals from nanoseconds, without floating point or printf: the
  // writer formats every event of every tensor (5 per tensor per step), and on a machine with
  // fewer cores than ranks its CPU time is taken from the ranks.
  static void append_us(std::string& out, std::int64_t ns) {
    if (ns < 0) {
      out.push_back('-');
      ns = -ns;
    }
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), ns / 1000);
    out.append(buf, r.ptr);
    const auto frac = static_cast<int>(ns % 1000);
    out.push_back('.');
    out.push_back(static_cast<char>('0' + frac / 100));
    out.push_back(static_cast<char>('0' + frac / 10 % 10));
    out.push_back(static_cast<char>('0' + frac % 10));
  }
  static void append_int(std::string& out, std::uint64_t v) {
    char buf[24];
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out.append(buf, r.ptr);
  }

  void write(const Event& e) {
    if (!e.phase) {  // a new track: name it, and keep its line prefix
      const int tid = e.track;
      const std::string name = escape(e.name);
      std::fprintf(file_,
                   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"%s\"}},\n",
                   rank_, tid, name.c_str());
      if (tracks_.size() <= static_cast<std::size_t>(tid)) {
        tracks_.resize(static_cast<std::size_t>(tid) + 1);
      }
      // {"pid":R,"tid":T,"args":{"tensor":"NAME","dtype":"   (up to the dtype)
      tracks_[static_cast<std::size_t>(tid)] =
          "\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(tid) +
          ",\"args\":{\"tensor\":\"" + name + "\",\"dtype\":\"";
      return;
    }
    const auto ns = [&](clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(t - start_).count();
    };
    line_.clear();
    line_ += "{\"name\":\"";
    line_ += e.phase;
    line_ += "\",\"ph\":\"X\",\"ts\":";
    append_us(line_, ns(e.begin));
    line_ += ",\"dur\":";
    append_us(line_, ns(e.end) - ns(e.begin));
    line_ += ',';
    line_ += tracks_[static_cast<std::size_t>(e.track)];
    line_ += dtype_name(e.dtype);
    line_ += "\",\"bytes\":";
    append_int(line_, e.bytes);
    line_ += "}},\n";
    std::fwrite(line_.data(), 1, line_.size(), file_);
  }

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
