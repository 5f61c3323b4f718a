// kolo/engine/timeline.hpp — a Chrome-trace JSON timeline (KOLO_TIMELINE=path), loadable in
// Perfetto or chrome://tracing.
//
// The engine thread only appends small event records to a vector under a mutex; a writer thread
// formats and writes them, so the file system never stalls negotiation. Each tensor gets its own
// track (tid), named after the tensor, and its phases appear as complete ("X") events:
// NEGOTIATE, QUEUE, PACK, the collective (ALLREDUCE, ALLGATHER, BROADCAST), UNPACK.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
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

  // A phase of one tensor, from `begin` to `end`.
  void record(const std::string& tensor, const char* phase, clock::time_point begin,
              clock::time_point end, DataType dtype, std::size_t bytes) {
    if (!file_) return;
    std::lock_guard lock(mu_);
    events_.push_back({tensor, phase, begin, end, dtype, bytes});
    if (events_.size() >= 256) cv_.notify_one();
  }

  void close() {
    if (!file_) return;
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
    std::string tensor;
    const char* phase;
    clock::time_point begin, end;
    DataType dtype;
    std::size_t bytes;
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

  void write(const Event& e) {
    auto it = tids_.find(e.tensor);
    if (it == tids_.end()) {
      it = tids_.emplace(e.tensor, static_cast<int>(tids_.size()) + 1).first;
      std::fprintf(file_,
                   "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
                   "\"args\":{\"name\":\"%s\"}},\n",
                   rank_, it->second, escape(e.tensor).c_str());
    }
    const auto us = [&](clock::time_point t) {
      return std::chrono::duration<double, std::micro>(t - start_).count();
    };
    std::fprintf(file_,
                 "{\"name\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,"
                 "\"args\":{\"tensor\":\"%s\",\"dtype\":\"%s\",\"bytes\":%zu}},\n",
                 e.phase, rank_, it->second, us(e.begin), us(e.end) - us(e.begin),
                 escape(e.tensor).c_str(), std::string(dtype_name(e.dtype)).c_str(), e.bytes);
  }

  std::FILE* file_ = nullptr;
  int rank_ = 0;
  clock::time_point start_;
  std::thread writer_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;
  bool stop_ = false;
  std::unordered_map<std::string, int> tids_;
};

}  // namespace kolo
