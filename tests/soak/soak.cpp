// kolo_soak: many collectives of random kind, size, dtype, op and algorithm, every element of
// every result checked on every rank. Run under kolo-run (tests/soak/soak.sh for the 100,000
// collective soak; CTest's soak/ci/* for a CI-sized one):
//
//   kolo-run -np 4 kolo_soak [--collectives N] [--seed S] [--max-count C] [--engine 0|1]
//
// Every rank draws the same sequence of calls from one seeded generator (collectives must be
// called in the same order everywhere); what differs per rank is its data. Each call is one of:
//   allreduce       any dtype and op, in place or not, its algorithm forced per call (ring,
//                   double tree, halving-doubling, recursive doubling, hierarchical) or left to
//                   the Selector's cost model
//   allgather(v)    equal or random per-rank counts
//   broadcast       chain or binomial, any root
//   reduce_scatter, alltoall, barrier
//   engine batch    1-8 named tensors through kolo::Engine (allreduce with pre/postscale,
//                   allgather, broadcast), each rank submitting them in its own random order;
//                   each tensor counts as one collective
// Inputs are small integers (|x| <= 4, products of at most two 2s and -1s per rank), so every
// summation order is exact in every dtype; results are compared exactly, except a floating-point
// average, whose one rounded division may differ by one unit in the last place.
//
// --inject-error CALL makes rank 1 miscount one element from that call on: a self-test that the
// checking is real (CTest's soak/detects_wrong expects the report and exit status 1).
//
// Exit status: 0 when every element on every rank was right, 1 when any was wrong (the first
// few are printed with everything needed to reproduce them: seed, call number, parameters).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <kolo/communicator.hpp>
#include <kolo/engine/engine.hpp>

#include "../common/reference_reduce.hpp"

namespace {

using kolo::AllreduceAlgorithm;
using kolo::BroadcastAlgorithm;
using kolo::DataType;
using kolo::ReduceOp;
using kolo::TensorView;

struct Options {
  long long collectives = 3000;
  std::uint64_t seed = 1;
  std::size_t max_count = 1 << 18;  // elements
  bool engine = true;
  long long report_every = 0;  // 0: ten reports
  long long inject_error = 0;  // > 0: rank 1 miscounts one element at this call (self-test)
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kolo_soak: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--collectives") {
      o.collectives = std::stoll(next());
    } else if (a == "--seed") {
      o.seed = std::stoull(next());
    } else if (a == "--max-count") {
      o.max_count = std::stoull(next());
    } else if (a == "--engine") {
      o.engine = next() != "0";
    } else if (a == "--report-every") {
      o.report_every = std::stoll(next());
    } else if (a == "--inject-error") {
      o.inject_error = std::stoll(next());
    } else {
      std::fprintf(stderr,
                   "usage: kolo_soak [--collectives N] [--seed S] [--max-count C] "
                   "[--engine 0|1] [--report-every K] [--inject-error CALL]\n");
      std::exit(2);
    }
  }
  return o;
}

template <class T>
constexpr bool is_half_v = std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>;
template <class T>
constexpr bool is_float_v = is_half_v<T> || std::is_floating_point_v<T>;
template <class T>
constexpr bool is_signed_v = is_float_v<T> || std::is_signed_v<T>;

template <class T>
T from_int(long long v) {
  if constexpr (is_half_v<T>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double to_double(T v) {
  if constexpr (is_half_v<T>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// Rank r's element i of call `call`: small enough that any reduction over 8 ranks is exact.
template <class T>
long long value(ReduceOp op, std::uint64_t call, int rank, std::size_t i) {
  const auto k = static_cast<long long>((i * 7 + call * 13) % 1000003);
  if (op == ReduceOp::product) {
    if ((k + rank) % 3 == 0 && rank < 2) return 2;  // at most two factors of 2 per element
    if (is_signed_v<T> && (k + rank) % 5 == 0) return -1;
    return 1;
  }
  if (is_signed_v<T>) return (k + rank * 3) % 9 - 4;
  return (k + rank * 3) % 5;
}

template <class T>
void fill(T* p, std::size_t n, ReduceOp op, std::uint64_t call, int rank, std::size_t offset = 0) {
  for (std::size_t i = 0; i < n; ++i) p[i] = from_int<T>(value<T>(op, call, rank, offset + i));
}

// The exact reduction over `size` ranks of element i, as T.
template <class T>
T reduced(ReduceOp op, std::uint64_t call, int size, std::size_t i) {
  const long long acc =
      kolo_test::reduce_ranks(op, size, [&](int r) { return value<T>(op, call, r, i); });
  if (op != ReduceOp::average) return from_int<T>(acc);
  if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(acc / size);  // truncation toward zero, as the library promises
  } else if constexpr (is_half_v<T>) {
    return T(static_cast<float>(acc) / static_cast<float>(size));
  } else {
    return static_cast<T>(acc) / static_cast<T>(size);
  }
}

template <class T>
bool same(T got, T want, bool rounded) {
  if constexpr (is_float_v<T>) {
    const double g = to_double(got), w = to_double(want);
    if (g == w) return true;
    if (!rounded) return false;
    double ulp = 0;
    if constexpr (std::is_same_v<T, kolo::float16>) ulp = 1.0 / 1024;
    if constexpr (std::is_same_v<T, kolo::bfloat16>) ulp = 1.0 / 128;
    if constexpr (std::is_same_v<T, float>) ulp = 1.2e-7;
    if constexpr (std::is_same_v<T, double>) ulp = 2.3e-16;
    return std::fabs(g - w) <= ulp * std::max(1.0, std::fabs(w));
  } else {
    (void)rounded;
    return got == want;
  }
}

// ---------------------------------------------------------------- the run

struct Tally {
  long long calls = 0;  // collectives (an engine tensor counts as one)
  long long elements = 0;
  long long wrong = 0;
  std::map<std::string, long long> by_kind;
};

class Soak {
 public:
  Soak(const Options& o, kolo::Communicator<>& comm, kolo::Engine<>* engine)
      : o_(o), comm_(comm), engine_(engine), rng_(o.seed), local_rng_(o.seed * 7919 + 17) {
    rank_ = comm.rank();
    size_ = comm.size();
    local_rng_.seed(o.seed * 1000003 + static_cast<std::uint64_t>(rank_));
  }

  Tally run() {
    const long long report =
        o_.report_every > 0 ? o_.report_every : std::max<long long>(1, o_.collectives / 10);
    long long next_report = report;
    const auto t0 = std::chrono::steady_clock::now();
    while (t_.calls < o_.collectives) {
      ++call_;
      step();
      if (rank_ == 0 && t_.calls >= next_report) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("soak: %lld / %lld collectives, %lld elements checked, %lld wrong, %.1f s\n",
                    t_.calls, o_.collectives, t_.elements, t_.wrong, s);
        std::fflush(stdout);
        next_report += report;
      }
    }
    return t_;
  }

 private:
  std::uint64_t draw(std::uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  DataType any_dtype() { return kolo::all_dtypes[draw(8)]; }
  ReduceOp any_op() { return kolo::all_reduce_ops[draw(5)]; }

  // Mostly small, some medium, a few large; both ends of the range on purpose.
  std::size_t any_count() {
    const std::uint64_t k = draw(100);
    std::size_t c;
    if (k < 5) {
      c = draw(2);  // 0 or 1
    } else if (k < 60) {
      c = 2 + draw(256);
    } else if (k < 90) {
      c = 258 + draw(16 * 1024);
    } else {
      c = 16 * 1024 + draw(o_.max_count > 16 * 1024 ? o_.max_count - 16 * 1024 : 1);
    }
    return std::min(c, o_.max_count);
  }

  void step() {
    const std::uint64_t k = draw(100);
    if (engine_ && k < 8) {
      engine_batch();
    } else if (k < 50) {
      allreduce();
    } else if (k < 60) {
      allgather();
    } else if (k < 68) {
      allgatherv();
    } else if (k < 80) {
      broadcast();
    } else if (k < 90) {
      reduce_scatter();
    } else if (k < 98) {
      alltoall();
    } else {
      comm_.barrier();
      count("barrier", 0, 0);
    }
  }

  void count(const std::string& kind, long long elements, long long wrong) {
    ++t_.calls;
    ++t_.by_kind[kind];
    t_.elements += elements;
    t_.wrong += wrong;
  }

  template <class... A>
  void report_wrong(const char* fmt, A... args) {
    if (reported_++ >= 10) return;
    std::fprintf(stderr, "soak: rank %d, seed %llu, call %llu: ", rank_,
                 static_cast<unsigned long long>(o_.seed), static_cast<unsigned long long>(call_));
    std::fprintf(stderr, fmt, args...);
    std::fputc('\n', stderr);
  }

  // Compares n elements; `expect(i)` gives element i. Returns the number wrong.
  template <class T, class E>
  long long check(const std::string& what, const T* got, std::size_t n, E&& expect,
                  bool rounded = false) {
    long long bad = 0;
    // Self-test of the checker: from call --inject-error on, rank 1 sees its first non-empty
    // result with element 0 off by one, which must be reported as wrong.
    const bool inject = o_.inject_error > 0 && rank_ == 1 && n > 0 && !injected_ &&
                        call_ >= static_cast<std::uint64_t>(o_.inject_error);
    if (inject) injected_ = true;
    for (std::size_t i = 0; i < n; ++i) {
      const T want = expect(i);
      T g = got[i];
      if (inject && i == 0) g = from_int<T>(static_cast<long long>(to_double(g)) + 1);
      if (!same(g, want, rounded)) {
        if (bad == 0) {
          report_wrong("%s: element %zu of %zu is %g, expected %g", what.c_str(), i, n,
                       to_double(g), to_double(want));
        }
        ++bad;
      }
    }
    return bad;
  }

  // ---- allreduce ----
  void allreduce() {
    const DataType dt = any_dtype();
    const ReduceOp op = any_op();
    const std::size_t n = any_count();
    const bool in_place = draw(2) == 0;
    const std::uint64_t a = draw(6);  // 5: the cost model decides
    std::string algo = "auto";
    if (a < 5) {
      comm_.selector().force_allreduce(kolo::all_allreduce_algorithms[a]);
      algo = kolo::algorithm_name(kolo::all_allreduce_algorithms[a]);
    } else {
      comm_.selector().clear_overrides();
    }
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> in(n), out(n);
      fill(in.data(), n, op, call_, rank_);
      if (in_place) {
        comm_.allreduce(TensorView(std::span<T>(in)), op);
      } else {
        comm_.allreduce(TensorView(std::span<T>(in)), TensorView(std::span<T>(out)), op);
      }
      const T* got = in_place ? in.data() : out.data();
      const std::string what =
          "allreduce " + algo + " (" + kolo::algorithm_name(comm_.last_allreduce_algorithm()) +
          ") " + std::to_string(n) + " x " + std::string(kolo::dtype_name(dt)) + " " +
          std::string(kolo::reduce_op_name(op)) + (in_place ? " in place" : "");
      const long long bad = check(
          what, got, n, [&](std::size_t i) { return reduced<T>(op, call_, size_, i); },
          op == ReduceOp::average);
      count("allreduce/" + std::string(kolo::algorithm_name(comm_.last_allreduce_algorithm())),
            static_cast<long long>(n), bad);
    });
  }

  // ---- allgather ----
  void allgather() {
    const DataType dt = any_dtype();
    const std::size_t n = any_count() / static_cast<std::size_t>(size_);
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> in(n), out(n * static_cast<std::size_t>(size_));
      fill(in.data(), n, ReduceOp::sum, call_, rank_);
      comm_.allgather(TensorView(std::span<T>(in)), TensorView(std::span<T>(out)));
      const long long bad =
          check("allgather " + std::to_string(n) + " x " + std::string(kolo::dtype_name(dt)),
                out.data(), out.size(), [&](std::size_t i) {
                  return from_int<T>(value<T>(ReduceOp::sum, call_,
                                              static_cast<int>(i / std::max<std::size_t>(n, 1)),
                                              i % std::max<std::size_t>(n, 1)));
                });
      count("allgather", static_cast<long long>(out.size()), bad);
    });
  }

  void allgatherv() {
    const DataType dt = any_dtype();
    std::vector<std::size_t> counts(static_cast<std::size_t>(size_));
    for (auto& c : counts) c = any_count() / static_cast<std::size_t>(size_);
    std::vector<std::size_t> displ(counts.size(), 0);
    for (std::size_t r = 1; r < counts.size(); ++r) displ[r] = displ[r - 1] + counts[r - 1];
    const std::size_t total = displ.back() + counts.back();
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const std::size_t mine = counts[static_cast<std::size_t>(rank_)];
      std::vector<T> in(mine), out(total);
      fill(in.data(), mine, ReduceOp::sum, call_, rank_);
      comm_.allgatherv(TensorView(std::span<T>(in)), TensorView(std::span<T>(out)), counts);
      long long bad = 0;
      for (int r = 0; r < size_; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        bad +=
            check("allgatherv block of rank " + std::to_string(r) + " (" +
                      std::to_string(counts[ur]) + " x " + std::string(kolo::dtype_name(dt)) + ")",
                  out.data() + displ[ur], counts[ur],
                  [&](std::size_t i) { return from_int<T>(value<T>(ReduceOp::sum, call_, r, i)); });
      }
      count("allgatherv", static_cast<long long>(total), bad);
    });
  }

  // ---- broadcast ----
  void broadcast() {
    const DataType dt = any_dtype();
    const std::size_t n = any_count();
    const int root = static_cast<int>(draw(static_cast<std::uint64_t>(size_)));
    const std::uint64_t b = draw(3);  // 2: the cost model decides
    if (b < 2) {
      comm_.selector().force_broadcast(kolo::all_broadcast_algorithms[b]);
    } else {
      comm_.selector().clear_overrides();
    }
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> buf(n);
      if (rank_ == root) {
        fill(buf.data(), n, ReduceOp::sum, call_, root);
      } else {
        fill(buf.data(), n, ReduceOp::sum, call_ + 1, rank_);  // something else to overwrite
      }
      comm_.broadcast(TensorView(std::span<T>(buf)), root);
      const std::string algo = kolo::algorithm_name(comm_.last_broadcast_algorithm());
      const long long bad = check("broadcast " + algo + " from " + std::to_string(root) + " " +
                                      std::to_string(n) + " x " + std::string(kolo::dtype_name(dt)),
                                  buf.data(), n, [&](std::size_t i) {
                                    return from_int<T>(value<T>(ReduceOp::sum, call_, root, i));
                                  });
      count("broadcast/" + algo, static_cast<long long>(n), bad);
    });
  }

  // ---- reduce_scatter ----
  void reduce_scatter() {
    const DataType dt = any_dtype();
    const ReduceOp op = any_op();
    const std::size_t n = any_count() / static_cast<std::size_t>(size_);  // per rank
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      const std::size_t total = n * static_cast<std::size_t>(size_);
      std::vector<T> in(total), out(n);
      fill(in.data(), total, op, call_, rank_);
      comm_.reduce_scatter(TensorView(std::span<T>(in)), TensorView(std::span<T>(out)), op);
      const std::size_t base = n * static_cast<std::size_t>(rank_);
      const long long bad = check(
          "reduce_scatter " + std::to_string(n) + " x " + std::string(kolo::dtype_name(dt)) + " " +
              std::string(kolo::reduce_op_name(op)),
          out.data(), n, [&](std::size_t i) { return reduced<T>(op, call_, size_, base + i); },
          op == ReduceOp::average);
      count("reduce_scatter", static_cast<long long>(n), bad);
    });
  }

  // ---- alltoall ----
  void alltoall() {
    const DataType dt = any_dtype();
    const auto usize = static_cast<std::size_t>(size_);
    const std::size_t block = any_count() / usize;
    kolo::visit_dtype(dt, [&](auto tag) {
      using T = decltype(tag);
      std::vector<T> in(block * usize), out(block * usize);
      fill(in.data(), in.size(), ReduceOp::sum, call_, rank_);
      comm_.alltoall(TensorView(std::span<T>(in)), TensorView(std::span<T>(out)));
      // Block r of my output is block `rank_` of rank r's input.
      const std::size_t me = static_cast<std::size_t>(rank_);
      const long long bad = check(
          "alltoall " + std::to_string(block) + " x " + std::string(kolo::dtype_name(dt)),
          out.data(), out.size(), [&](std::size_t i) {
            const std::size_t r = i / std::max<std::size_t>(block, 1);
            const std::size_t j = i % std::max<std::size_t>(block, 1);
            return from_int<T>(value<T>(ReduceOp::sum, call_, static_cast<int>(r), me * block + j));
          });
      count("alltoall", static_cast<long long>(out.size()), bad);
    });
  }

  // ---- the engine ----
  struct EngineTensor {
    std::string name;
    int kind = 0;  // 0 allreduce, 1 allgather, 2 broadcast
    DataType dtype = DataType::float32;
    ReduceOp op = ReduceOp::sum;
    std::size_t count = 0;
    int root = 0;
    bool scaled = false;
    std::vector<std::byte> buf;
    kolo::Handle handle;
  };

  void engine_batch() {
    const std::size_t k = 1 + draw(8);
    std::vector<EngineTensor> ts(k);
    for (std::size_t j = 0; j < k; ++j) {
      EngineTensor& t = ts[j];
      t.kind = static_cast<int>(draw(10) < 6 ? 0 : draw(2) + 1);
      t.dtype = any_dtype();
      t.op = any_op();
      t.count = any_count() / 4;
      t.root = static_cast<int>(draw(static_cast<std::uint64_t>(size_)));
      // Scaling by powers of two stays exact; the engine scales float types only.
      t.scaled =
          t.kind == 0 && kolo::dtype_is_floating(t.dtype) && t.op == ReduceOp::sum && draw(2) == 0;
      // A small pool of names: the response cache sees the same names again and again.
      t.name = "soak/" + std::to_string(j) + "/" + std::to_string(t.kind) + "/" +
               std::to_string(draw(4));
      t.buf.resize(t.count * kolo::dtype_size(t.dtype));
    }
    // Each rank submits in its own order (negotiation must match them up by name).
    std::vector<std::size_t> order(k);
    for (std::size_t j = 0; j < k; ++j) order[j] = j;
    std::shuffle(order.begin(), order.end(), local_rng_);
    for (std::size_t j : order) {
      EngineTensor& t = ts[j];
      kolo::visit_dtype(t.dtype, [&](auto tag) {
        using T = decltype(tag);
        T* p = reinterpret_cast<T*>(t.buf.data());
        const int who = t.kind == 2 && rank_ != t.root ? rank_ + 100 : rank_;
        fill(p, t.count, t.op, call_ * 16 + j, who);
        const TensorView view(t.buf.data(), t.count, t.dtype);
        if (t.kind == 0) {
          t.handle = t.scaled ? engine_->allreduce_async(t.name, view, t.op, 0.5, 4.0)
                              : engine_->allreduce_async(t.name, view, t.op);
        } else if (t.kind == 1) {
          t.handle = engine_->allgather_async(t.name, view);
        } else {
          t.handle = engine_->broadcast_async(t.name, view, t.root);
        }
      });
    }
    for (EngineTensor& t : ts) {
      t.handle.wait();
      kolo::visit_dtype(t.dtype, [&](auto tag) {
        using T = decltype(tag);
        const std::uint64_t c = call_ * 16 + static_cast<std::uint64_t>(&t - ts.data());
        const std::string what = "engine " + t.name + " " + std::to_string(t.count) + " x " +
                                 std::string(kolo::dtype_name(t.dtype));
        long long bad = 0;
        long long elements = 0;
        if (t.kind == 0) {
          const T* got = reinterpret_cast<const T*>(t.buf.data());
          bad = check(
              what + " allreduce " + std::string(kolo::reduce_op_name(t.op)), got, t.count,
              [&](std::size_t i) {
                T v = reduced<T>(t.op, c, size_, i);
                if (t.scaled) v = from_double_exact<T>(to_double(v) * 2.0);
                return v;
              },
              t.op == ReduceOp::average);
          elements = static_cast<long long>(t.count);
          count("engine/allreduce", elements, bad);
        } else if (t.kind == 1) {
          const TensorView out = t.handle.output();
          const auto& counts = t.handle.counts();
          std::size_t off = 0;
          for (int r = 0; r < size_; ++r) {
            const std::size_t n = counts[static_cast<std::size_t>(r)];
            bad += check(what + " allgather block of rank " + std::to_string(r),
                         static_cast<const T*>(out.data) + off, n,
                         [&](std::size_t i) { return from_int<T>(value<T>(t.op, c, r, i)); });
            off += n;
          }
          if (off != out.count) {
            report_wrong("%s: allgather output has %zu elements, counts add up to %zu",
                         what.c_str(), out.count, off);
            ++bad;
          }
          elements = static_cast<long long>(out.count);
          count("engine/allgather", elements, bad);
        } else {
          const T* got = reinterpret_cast<const T*>(t.buf.data());
          bad = check(what + " broadcast from " + std::to_string(t.root), got, t.count,
                      [&](std::size_t i) { return from_int<T>(value<T>(t.op, c, t.root, i)); });
          elements = static_cast<long long>(t.count);
          count("engine/broadcast", elements, bad);
        }
      });
    }
  }

  template <class T>
  static T from_double_exact(double v) {
    if constexpr (is_half_v<T>) {
      return T(static_cast<float>(v));
    } else {
      return static_cast<T>(v);
    }
  }

  const Options& o_;
  kolo::Communicator<>& comm_;
  kolo::Engine<>* engine_;
  std::mt19937_64 rng_;        // the same on every rank: what to call
  std::mt19937_64 local_rng_;  // this rank's own: submission order in the engine
  std::uint64_t call_ = 0;
  int rank_ = 0;
  int size_ = 1;
  Tally t_;
  int reported_ = 0;
  bool injected_ = false;
};

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  try {
    const auto t0 = std::chrono::steady_clock::now();
    kolo::Communicator<> comm(kolo::Topology::from_env());
    std::unique_ptr<kolo::Engine<>> engine;
    if (o.engine)
      engine = std::make_unique<kolo::Engine<>>(kolo::Communicator<>(kolo::Topology::from_env()));
    Soak soak(o, comm, engine.get());
    const Tally t = soak.run();
    if (engine) engine->shutdown();
    // Totals over all ranks: every rank checked its own results.
    std::int64_t sums[3] = {t.calls, t.elements, t.wrong};
    comm.selector().clear_overrides();
    comm.allreduce(std::span<std::int64_t>(sums), ReduceOp::sum);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (comm.rank() == 0) {
      std::printf(
          "soak: %d ranks, transport %s, seed %llu: %lld collectives, %lld elements "
          "checked on all ranks, %lld wrong, %.1f s (%.0f collectives/s)\n",
          comm.size(), std::getenv("KOLO_TRANSPORT") ? std::getenv("KOLO_TRANSPORT") : "routed",
          static_cast<unsigned long long>(o.seed), t.calls, static_cast<long long>(sums[1]),
          static_cast<long long>(sums[2]), s, static_cast<double>(t.calls) / s);
      for (const auto& [kind, n] : t.by_kind) std::printf("soak:   %-32s %lld\n", kind.c_str(), n);
      std::fflush(stdout);
    }
    return sums[2] == 0 ? 0 : 1;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "soak: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 3;
  }
}
