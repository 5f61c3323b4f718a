// kolo/engine/detail/timeline_impl.hpp — the Timeline's file writer (engine/timeline.hpp): the
// writer thread, the JSON formatting, opening and closing the file.
//
// Header-only, timeline.hpp includes this file; with the compiled core only the library does
// (core/compiled_core.hpp, KOLO_IMPL_INLINE).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/core/compiled_core.hpp"
#include "kolo/engine/timeline.hpp"

namespace kolo {

KOLO_IMPL_INLINE void Timeline::open(const std::string& path, int rank) {
  // Mode 0600, never through a symlink (O_NOFOLLOW: a link planted at the path in a shared
  // directory is refused, not followed), and only a regular file of our own is truncated.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw ConfigError("KOLO_TIMELINE=" + path + " cannot be opened for writing: " +
                      std::strerror(errno) + (errno == ELOOP ? " (it is a symbolic link)" : ""));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != ::geteuid() ||
      ::ftruncate(fd, 0) != 0) {
    ::close(fd);
    throw ConfigError("KOLO_TIMELINE=" + path +
                      " is not a regular file owned by this user: not written");
  }
  file_ = ::fdopen(fd, "w");
  if (!file_) {
    ::close(fd);
    throw ConfigError("KOLO_TIMELINE=" + path + " cannot be opened for writing");
  }
  rank_ = rank;
  start_ = clock::now();
  std::fputs("[\n", file_);
  writer_ = std::thread([this] { run(); });
}

KOLO_IMPL_INLINE void Timeline::publish() {
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

KOLO_IMPL_INLINE void Timeline::close() {
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

KOLO_IMPL_INLINE void Timeline::run() {
  std::vector<Event> batch;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return stop_ || !events_.empty(); });
      batch.swap(events_);
      if (batch.empty() && stop_) return;
    }
    for (const Event& e : batch) write(e);
    batch.clear();
    std::fflush(file_);
  }
}

KOLO_IMPL_INLINE std::string Timeline::escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out.push_back(c);
  }
  return out;
}

KOLO_IMPL_INLINE void Timeline::append_us(std::string& out, std::int64_t ns) {
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

KOLO_IMPL_INLINE void Timeline::append_int(std::string& out, std::uint64_t v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}

KOLO_IMPL_INLINE void Timeline::write(const Event& e) {
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
    tracks_[static_cast<std::size_t>(tid)] = "\"pid\":" + std::to_string(rank_) +
                                             ",\"tid\":" + std::to_string(tid) +
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

}  // namespace kolo
