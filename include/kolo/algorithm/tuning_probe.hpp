// kolo/algorithm/tuning_probe.hpp — the Selector's constants, measured at communicator creation
// (or read from a file), identical on every rank.
//
// KOLO_TUNING chooses the source:
//   probe       (default for the shm/tcp/routed transports) rank 0 ping-pongs with one peer per
//               route it has — the first shared-memory peer and the first TCP peer — with 8-byte
//               and 256 KiB messages (shared memory: 9 warm-up rounds each, then 6 and 4 timed;
//               TCP: 1 warm-up, then 5 and 3 timed), and times the float32 sum kernel on
//               256 KiB; a few milliseconds on one host, ~40 ms over a 1 ms-latency link.
//   default     the built-in constants (Tuning's defaults); no communication at all.
//   file:PATH   rank 0 reads PATH (Tuning::to_text's format); if PATH does not exist it probes
//               and writes the result there, so later jobs start without probing (a cache).
// Whatever rank 0 ends up with is broadcast to every rank (binomial tree, a few microseconds),
// so all ranks feed the same numbers to the same model and select the same algorithms. A
// measurement is a model input, never a correctness input: a noisy probe can only make a
// choice slower, not wrong.
//
// Why α from 8-byte round trips and β from the 256 KiB ones: rt(m) = 2·(α + m·β), so α = rt(8)/2
// and β = (rt(256K) - rt(8)) / (2·256K) (Hockney's fit on two points). α takes the median round
// (what a message typically costs, wake-ups included), β the fastest of each kind (scheduler
// delays on a busy host only ever add time, and they are no property of the link). A token-bucket
// limiter whose burst exceeds 256 KiB hides its rate from this probe: measure such links once,
// longer, and pass the constants with file:PATH.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kolo/algorithm/broadcast_binomial.hpp"
#include "kolo/algorithm/options.hpp"
#include "kolo/algorithm/selection_config.hpp"
#include "kolo/algorithm/selector.hpp"
#include "kolo/core/config.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/transport/transport_ref.hpp"

namespace kolo {

struct TuningSource {
  using Kind = TuningKind;  // declared with its values in selection_config.hpp
  Kind kind = Kind::probe;
  std::string path;  // file

  // "probe", "default", "file:PATH" (the table's KOLO_TUNING choices); anything else is a
  // ConfigError naming `var`.
  static TuningSource parse(std::string_view value, std::string_view var = "KOLO_TUNING") {
    config::Var decl = config::vars::tuning;
    decl.name = var;
    auto chosen = config::parse_choice_arg<Kind>(decl, value);
    TuningSource s;
    s.kind = chosen.value;
    s.path = std::move(chosen.argument);
    return s;
  }

  static std::optional<TuningSource> from_env(const EnvLookup& env = process_env()) {
    const auto v = config::get_text(env, config::vars::tuning);
    if (!v) return std::nullopt;
    return parse(*v);
  }
};

// The peers rank 0 measures each route against (-1: no such route); the same on every rank.
struct ProbePartners {
  int shm = -1;
  int tcp = -1;
};

namespace detail {

inline constexpr std::uint64_t kTuningPlanTag = 0x6b6f6c6f706c616eull;   // "kolo plan"
inline constexpr std::uint64_t kTuningPingTag = 0x6b6f6c6f70696e67ull;   // "kolo ping"
inline constexpr std::uint64_t kTuningValueTag = 0x6b6f6c6f74756e65ull;  // "kolo tune"

inline Signature tuning_sig(std::uint64_t tag) {
  Signature s;
  s.collective = Collective::bootstrap;
  s.extra = tag;
  return s;
}

// What travels in the broadcast: plain doubles, the same layout on every rank of one build.
struct TuningWire {
  double shm_alpha, shm_beta, tcp_alpha, tcp_beta, gamma;
  std::uint64_t source;
  std::uint64_t cores;
};

// The cores this process may run on (its affinity mask; all online cores if unknown).
inline int available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Rounds per message size: warm-up rounds first, then timed ones. Shared memory gets enough
// warm-up rounds to cycle through every slot of its channels (8 by default): a slot's first use
// in a process page-faults its memory, which would otherwise be timed (it inflated β fivefold).
// TCP gets one: its rounds are expensive on a slow link, and sockets have no such first touch.
struct ProbeRounds {
  int warm, timed;
};
inline ProbeRounds probe_rounds(bool shm, bool big) {
  if (shm) return big ? ProbeRounds{9, 4} : ProbeRounds{9, 6};
  return big ? ProbeRounds{1, 3} : ProbeRounds{1, 5};
}
inline constexpr std::size_t kSmallBytes = 8;
inline constexpr std::size_t kBigBytes = 256 * 1024;

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Rank 0's side of the ping-pong with `peer` (pinger) or the peer's side (echo).
inline LinkCost ping_pong(TransportRef t, int peer, bool pinger, bool shm,
                          std::vector<std::byte>& buf, const Deadline& dl) {
  const Signature sig = tuning_sig(kTuningPingTag);
  auto round_trip = [&](std::size_t bytes) {
    const auto t0 = std::chrono::steady_clock::now();
    if (pinger) {
      auto s = t.isend(peer, buf.data(), bytes, sig);
      auto r = t.irecv(peer, buf.data() + kBigBytes, bytes, sig);
      t.wait(s, dl);
      t.wait(r, dl);
    } else {
      auto r = t.irecv(peer, buf.data() + kBigBytes, bytes, sig);
      t.wait(r, dl);
      auto s = t.isend(peer, buf.data(), bytes, sig);
      t.wait(s, dl);
    }
    return seconds_since(t0);
  };
  auto rounds = [&](std::size_t bytes, ProbeRounds pr) {
    std::vector<double> v;
    for (int i = 0; i < pr.warm + pr.timed; ++i) {
      const double s = round_trip(bytes);
      if (i >= pr.warm) v.push_back(s);
    }
    return v;
  };
  const std::vector<double> small = rounds(kSmallBytes, probe_rounds(shm, false));
  const std::vector<double> big = rounds(kBigBytes, probe_rounds(shm, true));
  LinkCost l;
  // α: the median small round trip — the typical cost of a message, wake-ups included (the
  // fastest one is two spinning processes on two idle cores, a fraction of a microsecond, which
  // collectives on a busy or oversubscribed host rarely see). β: the difference of the fastest
  // rounds, the per-byte cost without the scheduler noise that only ever adds time.
  std::vector<double> sorted = small;
  std::sort(sorted.begin(), sorted.end());
  const double rt_typical = sorted[sorted.size() / 2];
  const double rt_small = *std::min_element(small.begin(), small.end());
  const double rt_big = *std::min_element(big.begin(), big.end());
  l.alpha = rt_typical / 2;
  l.beta = std::max(1e-13, (rt_big - rt_small) / (2.0 * static_cast<double>(kBigBytes)));
  return l;
}

// γ: the float32 sum kernel on cache-resident 256 KiB operands, seconds per output byte.
inline double measure_gamma() {
  constexpr std::size_t n = 64 * 1024;
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n);
  const ReduceFn fn = reduce_function(DataType::float32, ReduceOp::sum);
  std::vector<double> times;
  for (int i = 0; i < 6; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(c.data(), a.data(), b.data(), n);
    const double s = seconds_since(t0);
    if (i > 0) times.push_back(s);
    a[i] = c[n - 1 - static_cast<std::size_t>(i)];  // keep the result observable
  }
  return std::max(1e-13, *std::min_element(times.begin(), times.end()) /
                             static_cast<double>(n * sizeof(float)));
}

inline bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// POSIX I/O rather than <fstream>: this header is part of <kolo/kolo.hpp>, whose compile time
// is a target (docs/performance.md).
inline Tuning read_tuning_file(const std::string& path) {
  const std::string where = "KOLO_TUNING=file:" + path;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw ConfigError(where + ": cannot open the file: " + std::strerror(errno));
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t k = ::read(fd, buf, sizeof(buf));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0 || text.size() > (1 << 20)) {
      ::close(fd);
      if (k < 0) throw ConfigError(where + ": cannot read the file: " + std::strerror(errno));
      break;
    }
    text.append(buf, static_cast<std::size_t>(k));
  }
  Tuning t = Tuning::from_text(text, where);
  t.source = Tuning::Source::file;
  return t;
}

inline void write_tuning_file(const std::string& path, const Tuning& t) {
  // Write then rename: a concurrent reader sees the old file or the whole new one. The temporary
  // file gets an unpredictable name and is created exclusively, mode 0600 (mkstemp: O_EXCL, so
  // a symlink or file planted next to the target is never followed nor overwritten).
  const std::string where = "KOLO_TUNING=file:" + path;
  std::string tmp = path + ".tmp.XXXXXX";
  const std::string text = t.to_text();
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0) throw ConfigError(where + ": cannot write " + tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t k = ::write(fd, text.data() + done, text.size() - done);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw ConfigError(where + ": cannot write " + tmp + ": " + std::strerror(e));
    }
    done += static_cast<std::size_t>(k);
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw ConfigError(where + ": cannot rename " + tmp + " to it: " + std::strerror(e));
  }
}

}  // namespace detail

// Runs on every rank at once (a collective). Errors (a bad file on rank 0, a lost peer) throw
// here; the caller aborts the transport so the other ranks get the same error.
inline Tuning negotiate_tuning(TransportRef t, const TuningSource& source, ProbePartners partners,
                               const Deadline& dl) {
  const int n = t.size();
  const int r = t.rank();
  if (n == 1 || source.kind == TuningSource::Kind::defaults) return Tuning{};
  AlgoOptions opt;
  opt.deadline = dl;

  Tuning tuning;
  bool probe = source.kind == TuningSource::Kind::probe;
  if (source.kind == TuningSource::Kind::file) {
    // Only rank 0 looks at the file (ranks on other hosts may see another file or none); it
    // tells the others whether it will probe.
    std::uint8_t plan = 0;
    if (r == 0) {
      if (detail::file_exists(source.path)) {
        tuning = detail::read_tuning_file(source.path);
      } else {
        plan = 1;
      }
    }
    opt.sig = detail::tuning_sig(detail::kTuningPlanTag);
    broadcast_binomial(t, &plan, 1, 0, opt);
    probe = plan != 0;
  }

  if (probe) {
    std::vector<std::byte> buf(2 * detail::kBigBytes);
    for (int route = 0; route < 2; ++route) {
      const int peer = route == 0 ? partners.shm : partners.tcp;
      if (peer <= 0 || peer >= n) continue;
      if (r == 0) {
        (route == 0 ? tuning.shm : tuning.tcp) =
            detail::ping_pong(t, peer, true, route == 0, buf, dl);
      } else if (r == peer) {
        detail::ping_pong(t, 0, false, route == 0, buf, dl);
      }
    }
    if (r == 0) {
      tuning.gamma = detail::measure_gamma();
      tuning.cores = detail::available_cores();
      tuning.source = Tuning::Source::probe;
      if (source.kind == TuningSource::Kind::file) detail::write_tuning_file(source.path, tuning);
    }
  }

  detail::TuningWire w{tuning.shm.alpha,
                       tuning.shm.beta,
                       tuning.tcp.alpha,
                       tuning.tcp.beta,
                       tuning.gamma,
                       static_cast<std::uint64_t>(tuning.source),
                       static_cast<std::uint64_t>(std::max(0, tuning.cores))};
  opt.sig = detail::tuning_sig(detail::kTuningValueTag);
  broadcast_binomial(t, &w, sizeof(w), 0, opt);
  Tuning out;
  out.shm = {w.shm_alpha, w.shm_beta};
  out.tcp = {w.tcp_alpha, w.tcp_beta};
  out.gamma = w.gamma;
  out.cores = static_cast<int>(w.cores);
  out.source = static_cast<Tuning::Source>(w.source);
  return out;
}

}  // namespace kolo
