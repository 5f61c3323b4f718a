// kolo-bench — nccl-tests' command line and output for kolo and its peers (Open MPI, Gloo, NCCL).
//
//   kolo-run -np 4 kolo-bench -b 8 -e 64M -f 2                   (kolo, allreduce, float, sum)
//   kolo-run -np 4 kolo-bench --transport tcp -C allgather -d half
//   mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -np 4 kolo-bench --impl mpi
//   kolo-run -np 4 kolo-bench --impl gloo-ring-chunked
//   kolo-bench --memcpy -b 1M -e 256M                             (this machine's memcpy M)
//
// Conventions (docs/performance.md): time = mean per operation after warm-up,
// averaged across ranks; algbw = size / time, busbw = algbw x the collective's factor, GB = 1e9;
// results are checked outside the timed loop with small-integer inputs that make every
// summation order exact, so the tolerance is 0 and any difference is a wrong element.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <kolo/algorithm/selector.hpp>
#include <kolo/compression/compressor.hpp>
#include <kolo/core/dtype.hpp>
#include <kolo/core/error.hpp>
#include <kolo/core/float16.hpp>

#include "../tests/common/reference_reduce.hpp"
#include "bench_impl.hpp"

namespace kolo::bench {

// ---------------------------------------------------------------- default (host) buffers

void* Impl::allocate(std::size_t bytes) {
  // Page-aligned, so that no two buffers share a cache line or a page with anything else.
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
void Impl::deallocate(void* p) {
  std::free(p);
}
void Impl::copy_to_buffer(void* dst, const void* host, std::size_t bytes) {
  std::memcpy(dst, host, bytes);
}
void Impl::copy_from_buffer(void* host, const void* src, std::size_t bytes) {
  std::memcpy(host, src, bytes);
}

namespace {

// ---------------------------------------------------------------- command line

class ArgError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr const char* kUsage = R"(Usage: kolo-bench [options]
  Run under a launcher: kolo-run -np N kolo-bench ... (kolo, gloo), or
  mpirun --allow-run-as-root --oversubscribe -np N kolo-bench --impl mpi ...
  (or --impl kolo --transport mpi|mpi-native, also under mpirun)

  -C, --coll <name>          allreduce (default), allgather, broadcast, reduce_scatter, alltoall
  -b, --minbytes <size>      smallest size in bytes, K/M/G suffixes (x1024); default 8
  -e, --maxbytes <size>      largest size; default 32M
  -f, --stepfactor <n>       multiply the size by n between rows; default 2
  -n, --iters <n>            timed iterations per size; default 20
  -w, --warmup_iters <n>     untimed iterations before timing, per size; default 5
  -c, --check <n>            checked iterations per size (outside the timed loop); default 1
  -o, --op <op>              sum (default), prod, min, max, avg
  -d, --datatype <type>      float (default), half, bfloat16, double, int8, uint8, int32, int64
                             (kolo names too: float32, float16, fp16, bf16, ...)
  -r, --root <rank>          broadcast root; default 0
  -J, --json <file>          also write the results as JSON (rank 0)
      --impl <name>          kolo (default), mpi, gloo, gloo-ring-chunked, nccl
      --transport <t>        kolo's route: shm, tcp, routed (sets KOLO_TRANSPORT); mpi,
                             mpi-native (kolo over MPI, under mpirun)
      --algo <a>             kolo's algorithm: auto (default: the Selector decides per size);
                             allreduce: ring, tree, halving-doubling, recursive-doubling,
                             hierarchical, direct; broadcast: chain, binomial; allgather and
                             reduce_scatter: ring; alltoall: pairwise
      --compression <c>      none (default), fp16, bf16: kolo allreduce of float32 sum/avg
                             with a 16-bit wire (the engine's compressor)
      --buffers <b>          kolo's buffers: plain (default: malloc'd, through the channels) or
                             shared (Communicator::allocate: on one host the peers map them and
                             the allreduce reads them in place, zero copy)
      --rotate <n|auto>      buffer sets rotated through the timed loop; default auto
      --memcpy               measure this machine's memcpy bandwidth instead (one process)
      --threads <n>          --memcpy: copying threads, each with its own buffers; default 1
      --inject-wrong         testing aid: corrupt one checked element on rank 0
  -h, --help                 this text
Exit status: 0 all results correct, 1 wrong results or a runtime error, 2 bad arguments,
3 the implementation is not available in this build or on this machine.
)";

struct Options {
  Coll coll = Coll::allreduce;
  std::size_t min_bytes = 8;
  std::size_t max_bytes = 32u << 20;
  std::size_t factor = 2;
  long iters = 20;
  long warmup = 5;
  long check = 1;
  ReduceOp op = ReduceOp::sum;
  DataType dtype = DataType::float32;
  int root = 0;
  std::string json;
  std::string impl = "kolo";
  std::optional<std::string> transport;
  std::string algo = "auto";
  std::string compression = "none";
  bool shared_buffers = false;
  long rotate = 0;  // 0: auto
  bool memcpy_mode = false;
  long threads = 1;
  bool inject_wrong = false;
  bool help = false;
  bool bytes_given = false;
};

std::size_t parse_size(const std::string& flag, const std::string& s) {
  std::size_t pos = 0;
  unsigned long long v = 0;
  try {
    if (s.empty() || s[0] == '-' || s[0] == '+') throw std::invalid_argument("sign");
    v = std::stoull(s, &pos, 10);
  } catch (const std::exception&) {
    throw ArgError(flag + " " + s + ": not a size (a number of bytes with an optional K, M or G)");
  }
  const std::string suffix = s.substr(pos);
  unsigned long long mult = 1;
  if (suffix == "K" || suffix == "k") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "m") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "g") {
    mult = 1ull << 30;
  } else if (!suffix.empty()) {
    throw ArgError(flag + " " + s + ": unknown size suffix '" + suffix +
                   "' (use K, M or G, powers of 1024)");
  }
  if (v > std::numeric_limits<unsigned long long>::max() / mult) {
    throw ArgError(flag + " " + s + ": size too large");
  }
  return static_cast<std::size_t>(v * mult);
}

long parse_count(const std::string& flag, const std::string& s, long min) {
  std::size_t pos = 0;
  long v = 0;
  try {
    v = std::stol(s, &pos, 10);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (pos == 0 || pos != s.size()) throw ArgError(flag + " " + s + ": not an integer");
  if (v < min) throw ArgError(flag + " " + s + ": must be at least " + std::to_string(min));
  return v;
}

Coll parse_coll(const std::string& s) {
  for (Coll c : kAllColls) {
    if (s == coll_name(c)) return c;
  }
  if (s == "all_reduce") return Coll::allreduce;
  if (s == "all_gather") return Coll::allgather;
  if (s == "reducescatter") return Coll::reduce_scatter;
  if (s == "all_to_all") return Coll::alltoall;
  throw ArgError("unknown collective '" + s +
                 "' (expected allreduce, allgather, broadcast, reduce_scatter, alltoall)");
}

// --algo names what kolo's Selector can be forced to; which names apply depends on -C.
void check_algo(const Options& o) {
  if (o.algo == "auto") return;
  if (o.impl != "kolo") {
    throw ArgError("--algo " + o.algo + " chooses kolo's algorithm; --impl " + o.impl +
                   " picks its own");
  }
  // Every collective's registry: its names and aliases (and any registered algorithm's).
  try {
    switch (o.coll) {
      case Coll::allreduce:
        parse_algorithm<AllreduceAlgorithm>(o.algo, "allreduce");
        return;
      case Coll::broadcast:
        parse_algorithm<BroadcastAlgorithm>(o.algo, "broadcast");
        return;
      case Coll::allgather:
        parse_algorithm<AllgatherAlgorithm>(o.algo, "allgather");
        return;
      case Coll::reduce_scatter:
        parse_algorithm<ReduceScatterAlgorithm>(o.algo, "reduce_scatter");
        return;
      case Coll::alltoall:
        parse_algorithm<AlltoallAlgorithm>(o.algo, "alltoall");
        return;
    }
  } catch (const ConfigError& e) {
    throw ArgError(std::string("--algo: ") + e.what());
  }
}

// Wire compression is the engine's float32 gradient path: allreduce, sum or average.
void check_compression(const Options& o) {
  try {
    if (!CompressionPolicy::parse(o.compression).enabled()) return;
  } catch (const ConfigError&) {
    throw ArgError("unknown --compression '" + o.compression + "' (expected none, fp16, bf16)");
  }
  if (o.impl != "kolo") {
    throw ArgError("--compression " + o.compression + " is kolo's; --impl " + o.impl + " has none");
  }
  if (o.coll != Coll::allreduce || o.dtype != DataType::float32 ||
      (o.op != ReduceOp::sum && o.op != ReduceOp::average)) {
    throw ArgError("--compression " + o.compression +
                   " applies to float32 allreduce with sum or avg (gradients), not " +
                   std::string(coll_name(o.coll)) + " of " + std::string(dtype_name(o.dtype)) +
                   " with " + std::string(reduce_op_name(o.op)));
  }
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string name, value;
    bool has_value = false;
    if (arg.rfind("--", 0) == 0) {
      name = arg.substr(2);
      if (auto eq = name.find('='); eq != std::string::npos) {
        value = name.substr(eq + 1);
        name.resize(eq);
        has_value = true;
      }
    } else if (arg.size() >= 2 && arg[0] == '-') {
      name = arg.substr(1, 1);
      if (arg.size() > 2) {  // -b8, as getopt allows
        value = arg.substr(2);
        has_value = true;
      }
    } else {
      throw ArgError("unexpected argument '" + arg + "'");
    }
    auto need = [&]() -> std::string {
      if (has_value) return value;
      if (i + 1 >= argc) throw ArgError("option " + arg + " needs a value");
      return argv[++i];
    };
    auto flag_only = [&] {
      if (has_value) throw ArgError("option --" + name + " takes no value");
    };
    if (name == "h" || name == "help") {
      o.help = true;
    } else if (name == "C" || name == "coll") {
      o.coll = parse_coll(need());
    } else if (name == "b" || name == "minbytes") {
      o.min_bytes = parse_size("-b", need());
      o.bytes_given = true;
    } else if (name == "e" || name == "maxbytes") {
      o.max_bytes = parse_size("-e", need());
      o.bytes_given = true;
    } else if (name == "f" || name == "stepfactor") {
      o.factor = static_cast<std::size_t>(parse_count("-f", need(), 2));
    } else if (name == "n" || name == "iters") {
      o.iters = parse_count("-n", need(), 1);
    } else if (name == "w" || name == "warmup_iters") {
      o.warmup = parse_count("-w", need(), 0);
    } else if (name == "c" || name == "check") {
      o.check = parse_count("-c", need(), 0);
    } else if (name == "o" || name == "op") {
      try {
        o.op = parse_reduce_op(need());
      } catch (const ConfigError& e) {
        throw ArgError(e.what());
      }
    } else if (name == "d" || name == "datatype") {
      const std::string v = need();
      static const std::pair<const char*, DataType> nccl_names[] = {
          {"half", DataType::float16}, {"float", DataType::float32}, {"double", DataType::float64}};
      bool found = false;
      for (const auto& [n, t] : nccl_names) {
        if (v == n) {
          o.dtype = t;
          found = true;
        }
      }
      if (!found) {
        try {
          o.dtype = parse_dtype(v);
        } catch (const ConfigError& e) {
          throw ArgError(e.what());
        }
      }
    } else if (name == "r" || name == "root") {
      o.root = static_cast<int>(parse_count("-r", need(), 0));
    } else if (name == "J" || name == "json" || name == "output_file") {
      o.json = need();
    } else if (name == "impl") {
      o.impl = need();
      if (o.impl != "kolo" && o.impl != "mpi" && o.impl != "gloo" &&
          o.impl != "gloo-ring-chunked" && o.impl != "nccl") {
        throw ArgError("unknown --impl '" + o.impl +
                       "' (expected kolo, mpi, gloo, gloo-ring-chunked, nccl)");
      }
    } else if (name == "transport") {
      const std::string v = need();
      if (v == "nccl") {
        throw ArgError(
            "--transport nccl: not available yet (kolo has shm, tcp, routed, mpi "
            "and mpi-native today; --impl nccl runs NCCL itself)");
      }
      if (v != "shm" && v != "tcp" && v != "routed" && v != "mpi" && v != "mpi-native") {
        throw ArgError("unknown --transport '" + v +
                       "' (expected shm, tcp, routed, mpi, mpi-native)");
      }
      o.transport = v;
    } else if (name == "algo") {
      o.algo = need();
    } else if (name == "compression") {
      o.compression = need();
    } else if (name == "buffers") {
      const std::string v = need();
      if (v != "plain" && v != "shared") {
        throw ArgError("unknown --buffers '" + v + "' (expected plain, shared)");
      }
      o.shared_buffers = v == "shared";
    } else if (name == "rotate") {
      const std::string v = need();
      o.rotate = v == "auto" ? 0 : parse_count("--rotate", v, 1);
    } else if (name == "memcpy") {
      flag_only();
      o.memcpy_mode = true;
    } else if (name == "threads") {
      o.threads = parse_count("--threads", need(), 1);
    } else if (name == "inject-wrong") {
      flag_only();
      o.inject_wrong = true;
    } else {
      throw ArgError("unknown option '" + arg + "'");
    }
  }
  if (o.min_bytes > o.max_bytes) {
    throw ArgError("-b " + std::to_string(o.min_bytes) + " is larger than -e " +
                   std::to_string(o.max_bytes));
  }
  if (o.transport && o.impl != "kolo") {
    throw ArgError("--transport chooses kolo's route; --impl " + o.impl +
                   " picks its own (for MPI use mpirun --mca btl ...)");
  }
  check_algo(o);
  check_compression(o);
  if (o.shared_buffers && o.impl != "kolo") {
    throw ArgError("--buffers shared is kolo's (Communicator::allocate); --impl " + o.impl +
                   " has none");
  }
  return o;
}

// Only rank 0 of a launched job talks about arguments; a lone process always does.
bool env_rank_zero() {
  for (const char* v : {"KOLO_RANK", "OMPI_COMM_WORLD_RANK", "RANK", "PMI_RANK"}) {
    if (const char* s = std::getenv(v)) return std::string(s) == "0";
  }
  return true;
}

// ---------------------------------------------------------------- names and factors

std::string nccl_type_name(DataType t) {
  switch (t) {
    case DataType::float16:
      return "half";
    case DataType::float32:
      return "float";
    case DataType::float64:
      return "double";
    default:
      return std::string(dtype_name(t));
  }
}

std::string nccl_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::product:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::average:
      return "avg";
  }
  return "?";
}

// nccl-tests' bus-bandwidth factors: what each rank's link carries relative to the size.
double busbw_factor(Coll c, int n) {
  const double d = n;
  switch (c) {
    case Coll::allreduce:
      return 2.0 * (d - 1) / d;
    case Coll::allgather:
    case Coll::reduce_scatter:
    case Coll::alltoall:
      return (d - 1) / d;
    case Coll::broadcast:
      return 1.0;
  }
  return 1.0;
}

std::string busbw_formula(Coll c) {
  switch (c) {
    case Coll::allreduce:
      return "2(n-1)/n";
    case Coll::broadcast:
      return "1";
    default:
      return "(n-1)/n";
  }
}

// ---------------------------------------------------------------- cache size

// sysfs first: under KVM glibc's sysconf(_SC_LEVEL3_CACHE_SIZE) can report the host's cache
// (256 MiB on this machine, where sysfs and lscpu say 32 MiB).
std::size_t last_level_cache_bytes() {
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string s;
  if (f >> s && !s.empty()) {
    try {
      return parse_size("cache", s);
    } catch (const ArgError&) {
    }
  }
#ifdef _SC_LEVEL3_CACHE_SIZE
  if (long v = ::sysconf(_SC_LEVEL3_CACHE_SIZE); v > 0) return static_cast<std::size_t>(v);
#endif
  return 32u << 20;
}

std::string human_bytes(std::size_t b) {
  if (b >= (1u << 30) && b % (1u << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1u << 20) && b % (1u << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= (1u << 10) && b % (1u << 10) == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

// ---------------------------------------------------------------- data and checks

template <class T>
constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

template <class T>
T to_elem(long long v) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);  // integers wrap modulo 2^bits (C++20), as the reductions do
  }
}

template <class T>
T sentinel() {
  // Never an expected value: NaN equals nothing, the maximum is out of the inputs' reach.
  if constexpr (is_half_v<T>) {
    return T(std::numeric_limits<float>::quiet_NaN());
  } else if constexpr (std::is_floating_point_v<T>) {
    return std::numeric_limits<T>::quiet_NaN();
  } else {
    return std::numeric_limits<T>::max();
  }
}

// Equal, or within `tol` relative to the expected value (rounding on purpose: compression).
template <class T>
bool same(T got, T want, double tol) {
  double g, w;
  if constexpr (is_half_v<T>) {
    g = static_cast<float>(got);
    w = static_cast<float>(want);
  } else {
    if (got == want) return true;
    g = static_cast<double>(got);
    w = static_cast<double>(want);
  }
  return g == w || std::fabs(g - w) <= tol * std::fabs(w);
}

// ReduceOp::average's last step, written out here (not kolo's finish_average) so the check
// does not trust the code it checks: 16-bit floats divide in float, integers truncate.
template <class T>
T average_of(T sum, int n) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(sum) / static_cast<float>(n));
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(static_cast<std::int64_t>(sum) / n);
  } else {
    return sum / static_cast<T>(n);
  }
}

// The inputs: small integers, so every sum, product, minimum and maximum over up to 64 ranks is
// exact in every type (16-bit floats hold integers up to 256 or 2048 exactly), whatever order
// an algorithm adds them in. Integer overflow wraps identically on both sides.
struct Pattern {
  Coll coll;
  ReduceOp op;
  DataType dtype;
  int n;
  int me;
  int root;
  std::size_t count;  // row count
  std::size_t block;  // count / n

  long long value(int r, std::size_t i) const {
    const auto k = static_cast<long long>(i % 1000003);
    const bool uns = dtype == DataType::uint8;
    if (!coll_reduces(coll)) {
      const long long v = (k * 7 + r * 13) % 97;
      return uns ? v : v - 48;
    }
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average: {
        const long long v = (k * 7 + r * 3) % 9;
        return uns ? v % 5 : v - 4;
      }
      case ReduceOp::product:
        return (k + r) % 8 == 0 ? 2 : 1;
      case ReduceOp::min:
      case ReduceOp::max: {
        const long long v = (k * 5 + r * 11) % 13;
        return uns ? v : v - 6;
      }
    }
    return 0;
  }

  // Elements the check compares.
  std::size_t result_count() const { return coll == Coll::reduce_scatter ? block : count; }

  template <class T>
  T expected(std::size_t j) const {
    switch (coll) {
      case Coll::allgather:
        return to_elem<T>(value(static_cast<int>(j / block), j % block));
      case Coll::broadcast:
        return to_elem<T>(value(root, j));
      case Coll::alltoall:
        return to_elem<T>(
            value(static_cast<int>(j / block), static_cast<std::size_t>(me) * block + j % block));
      case Coll::allreduce:
      case Coll::reduce_scatter:
        break;
    }
    const std::size_t i =
        coll == Coll::reduce_scatter ? static_cast<std::size_t>(me) * block + j : j;
    const long long acc = kolo_test::reduce_ranks(op, n, [&](int r) { return value(r, i); });
    const T t = to_elem<T>(acc);
    return op == ReduceOp::average ? average_of(t, n) : t;
  }
};

// A buffer set: what one bound operation works on (nccl-tests' layout).
//   out-of-place: `in` and `out` separate.   in-place: one buffer, the larger of the two:
//   allreduce, broadcast, alltoall: in == out;  allgather: in = out + rank*block;
//   reduce_scatter: out = in + rank*block.
struct BufferSet {
  void* in = nullptr;
  void* out = nullptr;
};

struct Layout {
  std::size_t in_count, out_count;
};

Layout layout_of(Coll c, std::size_t count, int n) {
  const std::size_t block = count / static_cast<std::size_t>(n);
  switch (c) {
    case Coll::allgather:
      return {block, count};
    case Coll::reduce_scatter:
      return {count, block};
    default:
      return {count, count};
  }
}

class Buffers {
 public:
  Buffers(Impl& impl, std::size_t sets, std::size_t in_bytes, std::size_t out_bytes) : impl_(impl) {
    for (std::size_t k = 0; k < sets; ++k) {
      sets_.push_back({impl.allocate(in_bytes), impl.allocate(out_bytes)});
    }
  }
  ~Buffers() {
    for (auto& s : sets_) {
      impl_.deallocate(s.in);
      impl_.deallocate(s.out);
    }
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  const BufferSet& operator[](std::size_t k) const { return sets_[k]; }
  std::size_t size() const { return sets_.size(); }

 private:
  Impl& impl_;
  std::vector<BufferSet> sets_;
};

// Pointers of one set for one placement.
BufferSet placed(const BufferSet& s, Coll c, bool in_place, std::size_t block_bytes, int me) {
  if (!in_place) return s;
  const auto off = static_cast<std::size_t>(me) * block_bytes;
  switch (c) {
    case Coll::allgather:
      return {static_cast<std::byte*>(s.out) + off, s.out};
    case Coll::reduce_scatter:
      return {s.in, static_cast<std::byte*>(s.in) + off};
    case Coll::allreduce:
    case Coll::broadcast:
    case Coll::alltoall:
      return {s.out, s.out};
  }
  return s;
}

// The whole buffer an in-place operation works on (for filling).
void* in_place_base(const BufferSet& s, Coll c) {
  return c == Coll::reduce_scatter ? s.in : s.out;
}

// Writes gen(i) to elements [0, count) of an implementation's buffer: directly in host memory
// (no staging copy, which at 256 MiB x 8 ranks would double the job's footprint), through a
// host image for device memory.
template <class T, class Gen>
void write_buffer(Impl& impl, void* buf, std::size_t count, Gen&& gen) {
  if (!impl.device_memory()) {
    T* p = static_cast<T*>(buf);
    for (std::size_t i = 0; i < count; ++i) p[i] = gen(i);
    return;
  }
  std::vector<T> img(count);
  for (std::size_t i = 0; i < count; ++i) img[i] = gen(i);
  impl.copy_to_buffer(buf, img.data(), count * sizeof(T));
}

// Calls use(pointer to count readable elements) on an implementation's buffer.
template <class T, class Use>
auto read_buffer(Impl& impl, const void* buf, std::size_t count, Use&& use) {
  if (!impl.device_memory()) return use(static_cast<const T*>(buf));
  std::vector<T> img(count);
  impl.copy_from_buffer(img.data(), buf, count * sizeof(T));
  return use(static_cast<const T*>(img.data()));
}

// Fills one set for a checked run: inputs from the pattern, outputs with sentinels. In place
// there is one buffer: allgather holds the rank's block at its place and sentinels elsewhere,
// a broadcast non-root holds sentinels, everything else the rank's input.
template <class T>
void fill_for_check(Impl& impl, const Pattern& p, const BufferSet& set, bool in_place) {
  const Layout lay = layout_of(p.coll, p.count, p.n);
  const bool bcast_nonroot = p.coll == Coll::broadcast && p.me != p.root;
  auto input = [&](std::size_t i) {
    return bcast_nonroot ? sentinel<T>() : to_elem<T>(p.value(p.me, i));
  };
  if (!in_place) {
    write_buffer<T>(impl, set.in, lay.in_count, input);
    write_buffer<T>(impl, set.out, lay.out_count, [](std::size_t) { return sentinel<T>(); });
    return;
  }
  const std::size_t total = std::max(lay.in_count, lay.out_count);
  if (p.coll == Coll::allgather) {
    const std::size_t lo = static_cast<std::size_t>(p.me) * p.block;
    write_buffer<T>(impl, in_place_base(set, p.coll), total, [&](std::size_t i) {
      return i >= lo && i < lo + p.block ? to_elem<T>(p.value(p.me, i - lo)) : sentinel<T>();
    });
  } else {
    write_buffer<T>(impl, in_place_base(set, p.coll), total, input);
  }
}

// Runs `bound` once on freshly filled buffers and counts this rank's wrong elements.
std::size_t check_once(Impl& impl, const Pattern& p, const BufferSet& set, bool in_place,
                       const BoundOp& bound, bool inject_wrong) {
  return visit_dtype(p.dtype, [&](auto tag) -> std::size_t {
    using T = decltype(tag);
    fill_for_check<T>(impl, p, set, in_place);
    bound.run();
    impl.synchronize();
    const std::size_t rc = p.result_count();
    // --inject-wrong pretends one element came back corrupted, to prove the check catches it.
    const std::size_t corrupt = inject_wrong && p.me == 0 && rc > 0 ? rc / 2 : rc;
    const double tol = impl.tolerance();
    return read_buffer<T>(impl, bound.result, rc, [&](const T* got) {
      std::size_t wrong = 0;
      for (std::size_t j = 0; j < rc; ++j) {
        wrong += !same(j == corrupt ? sentinel<T>() : got[j], p.expected<T>(j), tol);
      }
      return wrong;
    });
  });
}

// Fills every set once: touches the pages (no first-touch faults in the timed loop) and gives
// the timed loop ordinary numbers everywhere (no NaN sentinels: in-place runs reduce the output
// buffer).
void prefill(Impl& impl, const Pattern& p, const Buffers& bufs) {
  visit_dtype(p.dtype, [&](auto tag) {
    using T = decltype(tag);
    const Layout lay = layout_of(p.coll, p.count, p.n);
    auto gen = [&](std::size_t i) { return to_elem<T>(p.value(p.me, i)); };
    for (std::size_t k = 0; k < bufs.size(); ++k) {
      write_buffer<T>(impl, bufs[k].in, lay.in_count, gen);
      write_buffer<T>(impl, bufs[k].out, lay.out_count, gen);
    }
  });
}

// ---------------------------------------------------------------- output

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string time_str(double us) {
  if (us >= 1e6) return fmt("%.0f", us);
  if (us >= 1e4) return fmt("%.1f", us);
  return fmt("%.2f", us);
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') {
      o += '\\';
      o += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      o += fmt("\\u%04x", static_cast<unsigned char>(c));
    } else {
      o += c;
    }
  }
  return o;
}

struct Measure {
  bool valid = false;
  std::string na_reason;
  double time_us = 0, algbw = 0, busbw = 0;
  std::size_t wrong = 0;
};

struct Row {
  std::size_t size = 0, count = 0, sets = 1;
  std::string type, redop;
  int root = -1;
  std::string algo;  // what the implementation ran, when it says (kolo's Selector)
  Measure oop, ip;
};

std::string measure_json(const Measure& m) {
  if (!m.valid) return "{\"na\": \"" + json_escape(m.na_reason) + "\"}";
  std::ostringstream o;
  o << "{\"time_us\": " << fmt("%.4f", m.time_us) << ", \"algbw\": " << fmt("%.6f", m.algbw)
    << ", \"busbw\": " << fmt("%.6f", m.busbw) << ", \"wrong\": " << m.wrong << "}";
  return o.str();
}

// ---------------------------------------------------------------- memcpy mode

int run_memcpy(const Options& o) {
  const std::size_t llc = last_level_cache_bytes();
  const auto threads = static_cast<std::size_t>(o.threads);
  const std::size_t lo = o.bytes_given ? o.min_bytes : (1u << 20);
  const std::size_t hi = o.bytes_given ? o.max_bytes : (256u << 20);
  std::printf("# kolo-bench --memcpy: std::memcpy bandwidth of this machine\n");
  std::printf("# threads %zu (each copies its own buffers, all at once), iters %ld, warmup %ld\n",
              threads, o.iters, o.warmup);
  std::printf("# bw = bytes copied per second per thread, aggregate = all threads; GB = 1e9;\n");
  std::printf("# each byte copied is one read and one write (2 bytes of memory traffic)\n");
  std::printf("# last-level cache %s: sizes well above it measure DRAM (M)\n",
              human_bytes(llc).c_str());
  std::printf("#%12s  %10s  %10s  %12s\n", "size(B)", "time(us)", "bw(GB/s)", "aggregate");
  struct MRow {
    std::size_t size;
    double us, bw, agg;
  };
  std::vector<MRow> rows;
  for (std::size_t bytes = lo; bytes <= hi; bytes *= o.factor) {
    std::vector<double> secs(threads, 0.0);
    auto body = [&](std::size_t t) {
      std::vector<std::byte> src(bytes, std::byte{1}), dst(bytes, std::byte{2});
      for (long i = 0; i < o.warmup; ++i) std::memcpy(dst.data(), src.data(), bytes);
      const auto t0 = std::chrono::steady_clock::now();
      for (long i = 0; i < o.iters; ++i) {
        std::memcpy(dst.data(), src.data(), bytes);
        // Keeps the compiler from treating repeated copies as one.
        asm volatile("" : : "r"(dst.data()) : "memory");
      }
      secs[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    std::vector<std::thread> pool;
    for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(body, t);
    body(0);
    for (auto& th : pool) th.join();
    const double worst = *std::max_element(secs.begin(), secs.end());
    const double us = worst / static_cast<double>(o.iters) * 1e6;
    const double bw = static_cast<double>(bytes) / (us * 1e3);
    rows.push_back({bytes, us, bw, bw * static_cast<double>(threads)});
    std::printf(" %12zu  %10s  %10.2f  %12.2f\n", bytes, time_str(us).c_str(), bw,
                bw * static_cast<double>(threads));
    std::fflush(stdout);
    if (bytes > hi / o.factor) break;
  }
  const MRow& last = rows.back();
  std::printf(
      "# M (memcpy bandwidth at %s, %zu thread(s)) : %.2f GB/s per thread, %.2f aggregate\n",
      human_bytes(last.size).c_str(), threads, last.bw, last.agg);
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\n  \"tool\": \"kolo-bench\", \"mode\": \"memcpy\", \"threads\": " << threads
      << ", \"llc_bytes\": " << llc << ",\n  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      f << "    {\"size\": " << rows[i].size << ", \"time_us\": " << fmt("%.4f", rows[i].us)
        << ", \"gbps\": " << fmt("%.4f", rows[i].bw)
        << ", \"aggregate_gbps\": " << fmt("%.4f", rows[i].agg) << "}"
        << (i + 1 < rows.size() ? ",\n" : "\n");
    }
    f << "  ],\n  \"M_gbps\": " << fmt("%.4f", last.bw)
      << ", \"M_aggregate_gbps\": " << fmt("%.4f", last.agg) << "\n}\n";
  }
  return 0;
}

// ---------------------------------------------------------------- the benchmark

std::unique_ptr<Impl> make_impl(const Options& o) {
  if (o.impl == "kolo") {
    const KoloConfig cfg{o.coll, o.algo, o.compression, o.shared_buffers};
    if (o.transport == "mpi" || o.transport == "mpi-native") {
      return make_kolo_mpi_impl(cfg, o.transport == "mpi-native");
    }
    return make_kolo_impl(cfg);
  }
  if (o.impl == "mpi") return make_mpi_impl();
  if (o.impl == "gloo") return make_gloo_impl(false);
  if (o.impl == "gloo-ring-chunked") return make_gloo_impl(true);
  return make_nccl_impl();
}

// Element count of a row: collectives that split the data among ranks need a multiple of the
// rank count (at least one element per rank); the printed size is the size actually moved.
std::size_t row_count(Coll c, std::size_t bytes, DataType t, int n) {
  std::size_t count = bytes / dtype_size(t);
  const auto un = static_cast<std::size_t>(n);
  if (c == Coll::allgather || c == Coll::reduce_scatter || c == Coll::alltoall) {
    count = std::max(un, count / un * un);
  }
  return std::max<std::size_t>(count, 1);
}

int run_bench(const Options& o) {
  if (o.transport && o.transport != "mpi" && o.transport != "mpi-native") {
    ::setenv("KOLO_TRANSPORT", o.transport->c_str(), 1);
  }
  std::unique_ptr<Impl> impl = make_impl(o);
  const int n = impl->size();
  const int me = impl->rank();
  const bool lead = me == 0;
  if (o.root >= n) {
    if (lead) {
      std::fprintf(stderr, "kolo-bench: -r %d: root is not a rank of this job (%d ranks)\n%s",
                   o.root, n, kUsage);
    }
    return 2;
  }
  const int root = o.coll == Coll::broadcast ? o.root : -1;
  const std::size_t llc = last_level_cache_bytes();
  const std::size_t es = dtype_size(o.dtype);
  const double factor = busbw_factor(o.coll, n);

  // Support is a property of (collective, dtype, op, placement), not of the size.
  OpSpec probe{o.coll, o.dtype, o.op, o.root, row_count(o.coll, o.min_bytes, o.dtype, n)};
  const auto na_oop = impl->unsupported(probe, false);
  const auto na_ip = impl->unsupported(probe, true);
  if (na_oop && na_ip) {
    if (lead) std::fprintf(stderr, "kolo-bench: %s\n", na_oop->c_str());
    impl->barrier();  // nobody leaves while a peer may still be connecting to it
    return 3;
  }

  std::vector<std::string> header;
  header.push_back(std::string("kolo-bench ") + "0.1.0" + ": " + std::string(coll_name(o.coll)) +
                   " (nccl-tests format)");
  header.push_back(
      "minBytes " + std::to_string(o.min_bytes) + " maxBytes " + std::to_string(o.max_bytes) +
      " step: " + std::to_string(o.factor) + "(factor) warmup iters: " + std::to_string(o.warmup) +
      " iters: " + std::to_string(o.iters) + " check iters: " + std::to_string(o.check) +
      " validation: small-integer inputs, tolerance " +
      (impl->tolerance() > 0 ? fmt("%g", impl->tolerance()) + " relative" : std::string("0")));
  header.push_back("ranks: " + std::to_string(n) + " | dtype: " + nccl_type_name(o.dtype) +
                   " | op: " + (coll_reduces(o.coll) ? nccl_op_name(o.op) : "none") +
                   " | root: " + std::to_string(root) + " | algorithm requested: " + o.algo +
                   " | compression: " + o.compression);
  for (const auto& d : impl->describe()) header.push_back(d);
  header.push_back(
      "buffers: " +
      (o.rotate > 0 ? "rotating " + std::to_string(o.rotate) + " buffer sets at every size"
                    : "sizes whose buffer set (input + output) fits in the " + human_bytes(llc) +
                          " last-level cache rotate through up to 64 fresh sets (enough to "
                          "cover 2x the cache) so no iteration finds its data in cache; "
                          "larger sizes use one set"));
  header.push_back(
      "time: mean per op after warm-up, averaged across ranks; algbw = size/time; "
      "busbw = algbw x " +
      busbw_formula(o.coll) + " (n = " + std::to_string(n) + "); GB = 1e9");
  if (na_oop) header.push_back("out-of-place: N/A: " + *na_oop);
  if (na_ip) header.push_back("in-place: N/A: " + *na_ip);
  if (lead) {
    for (const auto& h : header) std::printf("# %s\n", h.c_str());
    std::printf("#\n");
    std::printf("#%75s%35s\n", "out-of-place", "in-place");
    std::printf("#%11s  %12s  %8s  %6s  %6s  %8s  %7s  %7s  %6s  %8s  %7s  %7s  %6s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong");
    std::printf("#%11s  %12s  %8s  %6s  %6s  %8s  %7s  %7s  %6s  %8s  %7s  %7s  %6s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
    std::fflush(stdout);
  }

  std::vector<Row> rows;
  std::size_t wrong_total = 0;
  double busbw_sum = 0;
  int busbw_n = 0;
  for (std::size_t bytes = o.min_bytes;;) {
    Row row;
    row.count = row_count(o.coll, bytes, o.dtype, n);
    row.size = row.count * es;
    row.type = nccl_type_name(o.dtype);
    row.redop = coll_reduces(o.coll) ? nccl_op_name(o.op) : "none";
    row.root = root;
    const OpSpec spec{o.coll, o.dtype, o.op, o.root, row.count};
    const Layout lay = layout_of(o.coll, row.count, n);
    const std::size_t set_bytes = (lay.in_count + lay.out_count) * es;
    std::size_t sets = 1;
    if (o.rotate > 0) {
      sets = static_cast<std::size_t>(o.rotate);
    } else if (set_bytes <= llc) {
      sets = std::min<std::size_t>(64, (2 * llc + set_bytes - 1) / set_bytes);
    }
    row.sets = sets;
    Buffers bufs(*impl, sets, lay.in_count * es, lay.out_count * es);
    const Pattern pat{o.coll, o.op,   o.dtype,   n,
                      me,     o.root, row.count, row.count / static_cast<std::size_t>(n)};
    prefill(*impl, pat, bufs);

    for (int place = 0; place < 2; ++place) {
      const bool in_place = place == 1;
      Measure& m = in_place ? row.ip : row.oop;
      const auto& na = in_place ? na_ip : na_oop;
      if (na) {
        m.na_reason = *na;
        continue;
      }
      std::vector<BoundOp> bound;
      bound.reserve(sets);
      for (std::size_t k = 0; k < sets; ++k) {
        const BufferSet s = placed(bufs[k], o.coll, in_place, pat.block * es, me);
        bound.push_back(impl->bind(spec, s.in, s.out, in_place));
      }
      for (long i = 0; i < o.warmup; ++i) bound[static_cast<std::size_t>(i) % sets].run();
      impl->synchronize();
      impl->barrier();
      const auto t0 = std::chrono::steady_clock::now();
      for (long i = 0; i < o.iters; ++i) bound[static_cast<std::size_t>(i) % sets].run();
      impl->synchronize();
      const double secs =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      // Before sum_over_ranks: that is an allreduce of its own, with its own algorithm.
      const std::string ran = impl->last_algorithm();
      const double my_us = secs / static_cast<double>(o.iters) * 1e6;
      m.time_us = impl->sum_over_ranks(my_us) / n;
      m.algbw = static_cast<double>(row.size) / (m.time_us * 1e3);
      m.busbw = m.algbw * factor;
      std::size_t wrong = 0;
      for (long c = 0; c < o.check; ++c) {
        wrong += check_once(*impl, pat, placed(bufs[0], o.coll, in_place, pat.block * es, me),
                            in_place, bound[0], o.inject_wrong);
      }
      m.wrong = static_cast<std::size_t>(impl->sum_over_ranks(static_cast<double>(wrong)));
      m.valid = true;
      if (row.algo.empty()) row.algo = ran;
      wrong_total += m.wrong;
      busbw_sum += m.busbw;
      ++busbw_n;
    }
    if (lead) {
      std::printf("%12zu  %12zu  %8s  %6s  %6d", row.size, row.count, row.type.c_str(),
                  row.redop.c_str(), row.root);
      for (const Measure* m : {&row.oop, &row.ip}) {
        if (m->valid) {
          std::printf("  %8s  %7.2f  %7.2f  %6zu", time_str(m->time_us).c_str(), m->algbw, m->busbw,
                      m->wrong);
        } else {
          std::printf("  %8s  %7s  %7s  %6s", "N/A", "N/A", "N/A", "N/A");
        }
      }
      std::printf("\n");
      std::fflush(stdout);
    }
    rows.push_back(row);
    if (bytes > o.max_bytes / o.factor) break;  // the next step would pass -e (or overflow)
    bytes *= o.factor;
  }

  const double avg_busbw = busbw_n ? busbw_sum / busbw_n : 0.0;
  if (lead && !rows.empty() && !rows.front().algo.empty()) {
    // Which algorithm ran where, as size ranges: the Selector's decisions, seen from outside.
    std::string ranges;
    std::size_t first = 0;
    for (std::size_t i = 1; i <= rows.size(); ++i) {
      if (i < rows.size() && rows[i].algo == rows[first].algo) continue;
      ranges += (ranges.empty() ? "" : ", ") + std::to_string(rows[first].size) +
                (i - 1 > first ? "-" + std::to_string(rows[i - 1].size) : "") + " B " +
                rows[first].algo;
      first = i;
    }
    std::printf("# Algorithm by size : %s\n", ranges.c_str());
  }
  if (lead) {
    const char* env_transport = std::getenv("KOLO_TRANSPORT");
    const std::string transport_name = o.impl != "kolo" ? o.impl
                                       : o.transport    ? *o.transport
                                       : env_transport  ? env_transport
                                                        : "routed";
    std::printf("# Out of bounds values : %zu %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth : %.4f\n", avg_busbw);
    std::printf("#\n");
    std::fflush(stdout);
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << "{\n  \"tool\": \"kolo-bench\", \"version\": \"0.1.0\", \"collective\": \""
        << coll_name(o.coll) << "\", \"impl\": \"" << o.impl << "\", \"transport\": \""
        << transport_name << "\",\n  \"ranks\": " << n << ", \"dtype\": \""
        << nccl_type_name(o.dtype) << "\", \"op\": \"" << nccl_op_name(o.op)
        << "\", \"root\": " << root << ", \"iters\": " << o.iters
        << ", \"warmup_iters\": " << o.warmup << ", \"check_iters\": " << o.check
        << ", \"llc_bytes\": " << llc << ",\n  \"header\": [";
      for (std::size_t i = 0; i < header.size(); ++i) {
        f << (i ? ", " : "") << "\"" << json_escape(header[i]) << "\"";
      }
      f << "],\n  \"rows\": [\n";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        const Row& r = rows[i];
        f << "    {\"size\": " << r.size << ", \"count\": " << r.count << ", \"type\": \"" << r.type
          << "\", \"redop\": \"" << r.redop << "\", \"root\": " << r.root
          << ", \"buffer_sets\": " << r.sets << ", \"algorithm\": \"" << r.algo << "\""
          << ", \"out_of_place\": " << measure_json(r.oop)
          << ", \"in_place\": " << measure_json(r.ip) << "}"
          << (i + 1 < rows.size() ? ",\n" : "\n");
      }
      f << "  ],\n  \"wrong_total\": " << wrong_total
        << ", \"avg_busbw\": " << fmt("%.6f", avg_busbw)
        << ", \"ok\": " << (wrong_total ? "false" : "true") << "\n}\n";
      if (!f) std::fprintf(stderr, "kolo-bench: could not write %s\n", o.json.c_str());
    }
  }
  return wrong_total ? 1 : 0;
}

}  // namespace

}  // namespace kolo::bench

int main(int argc, char** argv) {
  using namespace kolo::bench;
  Options o;
  try {
    o = parse_args(argc, argv);
  } catch (const ArgError& e) {
    if (env_rank_zero()) std::fprintf(stderr, "kolo-bench: %s\n%s", e.what(), kUsage);
    return 2;
  }
  if (o.help) {
    if (env_rank_zero()) std::fputs(kUsage, stdout);
    return 0;
  }
  try {
    return o.memcpy_mode ? run_memcpy(o) : run_bench(o);
  } catch (const Unavailable& e) {
    std::fprintf(stderr, "kolo-bench: %s\n", e.what());
    return 3;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "kolo-bench: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo-bench: error: %s\n", e.what());
    return 1;
  }
}
