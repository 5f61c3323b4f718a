// In-process tests of the algorithms (Gloo's test style): threads as ranks over InprocTransport,
// each thread with its own Communicator<InprocTransport>, every collective through the Selector
// exactly as a process would run it. No process boundary, so every rank count of the matrix fits
// in one test binary, and ASan and TSan see all ranks at once.
//
// Each check computes the expected result of every element in closed form (exact integer
// arithmetic, or floating point on small integers, where every algorithm's result is exact) and
// records the first few differences per rank; the test thread then asserts there are none
// (doctest assertions stay on the test's own thread).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include <kolo/communicator.hpp>
#include <kolo/transport/inproc.hpp>

namespace inproc {

using Comm = kolo::Communicator<kolo::InprocTransport>;

// The matrix (issue 15, item 6).
inline const std::vector<int> kRankCounts = {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16};
inline const std::vector<std::size_t> kCounts = {0, 1, 7, 1000, 1048579};
inline constexpr std::size_t kLarge = 1048579;

// What went wrong on one rank (the first few differences are enough to see the pattern).
class Failures {
 public:
  void add(const std::string& what) {
    std::lock_guard<std::mutex> lk(mu_);
    ++count_;
    if (shown_.size() < 8) shown_.push_back(what);
  }
  std::size_t count() const { return count_; }
  std::string text() const {
    std::string s;
    for (const auto& x : shown_) s += x + "\n";
    return s;
  }

 private:
  std::mutex mu_;
  std::size_t count_ = 0;
  std::vector<std::string> shown_;
};

inline kolo::CommunicatorOptions options_from(
    std::vector<std::pair<std::string, std::string>> env) {
  return kolo::CommunicatorOptions::from_env(
      [env](const std::string& k) -> std::optional<std::string> {
        for (const auto& [n, v] : env) {
          if (n == k) return v;
        }
        return std::nullopt;
      });
}

// Runs body(comm, rank) on n threads, one Communicator<InprocTransport> each, and fails the test
// with every rank's exception if any threw.
inline void run_ranks(int n, const std::function<void(Comm&, int)>& body,
                      const kolo::CommunicatorOptions& opts = options_from({})) {
  kolo::InprocFabric fabric(n, 300.0);
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Comm comm(std::make_unique<kolo::InprocTransport>(fabric, r), opts);
        body(comm, r);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    const std::string& e = errors[static_cast<std::size_t>(r)];
    CHECK_MESSAGE(e.empty(), "rank ", r, " of ", n, " threw: ", e);
  }
}

// ---------------------------------------------------------------- element values

template <class T>
T as(double v) {
  if constexpr (std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>) {
    return T(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double num(T v) {
  if constexpr (std::is_same_v<T, kolo::float16> || std::is_same_v<T, kolo::bfloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

// One exact case of allreduce: a dtype, an op, and rank r's value of element i.
struct AllreduceCase {
  const char* name;
  kolo::DataType dtype;
  kolo::ReduceOp op;
  double (*value)(int r, std::size_t i, int n);
  // The expected result of element i over n ranks (exact for these values).
  double (*expect)(std::size_t i, int n);
};

inline double int_value(int r, std::size_t i, int) {
  return static_cast<double>((r + 1) * static_cast<int>(i % 97 + 1));
}
inline double int_sum(std::size_t i, int n) {
  return static_cast<double>(n * (n + 1) / 2 * static_cast<int>(i % 97 + 1));
}

// The cases for small counts; the large count runs the first (int32 sum) only.
inline const std::vector<AllreduceCase>& allreduce_cases() {
  static const std::vector<AllreduceCase> cases = {
      {"int32 sum", kolo::DataType::int32, kolo::ReduceOp::sum, int_value, int_sum},
      {"float32 sum", kolo::DataType::float32, kolo::ReduceOp::sum, int_value, int_sum},
      {"float64 average", kolo::DataType::float64, kolo::ReduceOp::average,
       [](int r, std::size_t i, int) { return static_cast<double>((r + 1) * (i % 13 + 1)); },
       [](std::size_t i, int n) { return (n + 1) / 2.0 * static_cast<double>(i % 13 + 1); }},
      {"int64 max", kolo::DataType::int64, kolo::ReduceOp::max,
       [](int r, std::size_t i, int) {
         return static_cast<double>(static_cast<long>((r * 7919 + i * 31) % 1009) - 500);
       },
       [](std::size_t i, int n) {
         double m = -1e300;
         for (int r = 0; r < n; ++r)
           m = std::max(m,
                        static_cast<double>(static_cast<long>((r * 7919 + i * 31) % 1009) - 500));
         return m;
       }},
      {"int8 min", kolo::DataType::int8, kolo::ReduceOp::min,
       [](int r, std::size_t i, int) {
         return static_cast<double>(static_cast<int>((r * 37 + i * 11) % 200) - 100);
       },
       [](std::size_t i, int n) {
         double m = 1e300;
         for (int r = 0; r < n; ++r)
           m = std::min(m, static_cast<double>(static_cast<int>((r * 37 + i * 11) % 200) - 100));
         return m;
       }},
      {"uint8 prod", kolo::DataType::uint8, kolo::ReduceOp::product,
       [](int r, std::size_t i, int) { return static_cast<double>(1 + (r + i) % 3); },
       [](std::size_t i, int n) {
         std::uint8_t p = 1;  // wraps modulo 256, as the kernel's uint8 arithmetic does
         for (int r = 0; r < n; ++r) p = static_cast<std::uint8_t>(p * (1 + (r + i) % 3));
         return static_cast<double>(p);
       }},
      {"float16 sum", kolo::DataType::float16, kolo::ReduceOp::sum,
       [](int r, std::size_t i, int) {
         return static_cast<double>(r % 4 + static_cast<int>(i % 3));
       },
       [](std::size_t i, int n) {
         double s = 0;
         for (int r = 0; r < n; ++r) s += r % 4 + static_cast<int>(i % 3);
         return s;
       }},
      {"bfloat16 max", kolo::DataType::bfloat16, kolo::ReduceOp::max,
       [](int r, std::size_t i, int) {
         return static_cast<double>(static_cast<int>((r * 3 + i) % 17) - 8);
       },
       [](std::size_t i, int n) {
         double m = -1e300;
         for (int r = 0; r < n; ++r)
           m = std::max(m, static_cast<double>(static_cast<int>((r * 3 + i) % 17) - 8));
         return m;
       }},
  };
  return cases;
}

template <class T>
void fill_case(std::vector<std::byte>& buf, const AllreduceCase& c, int r, int n,
               std::size_t count) {
  buf.resize(count * sizeof(T));
  auto* p = reinterpret_cast<T*>(buf.data());
  for (std::size_t i = 0; i < count; ++i) p[i] = as<T>(c.value(r, i, n));
}

template <class T>
void check_case(const std::vector<std::byte>& buf, const AllreduceCase& c, int n, std::size_t count,
                const std::string& where, Failures& f) {
  const auto* p = reinterpret_cast<const T*>(buf.data());
  for (std::size_t i = 0; i < count; ++i) {
    const double want = num(as<T>(c.expect(i, n)));
    const double got = num(p[i]);
    if (got != want) {
      std::ostringstream o;
      o << where << ": element " << i << " is " << got << ", expected " << want;
      f.add(o.str());
      return;  // one per call is enough
    }
  }
}

template <class F>
void with_type(kolo::DataType d, F&& f) {
  switch (d) {
    case kolo::DataType::int32:
      return f(std::int32_t{});
    case kolo::DataType::float32:
      return f(float{});
    case kolo::DataType::float64:
      return f(double{});
    case kolo::DataType::int64:
      return f(std::int64_t{});
    case kolo::DataType::int8:
      return f(std::int8_t{});
    case kolo::DataType::uint8:
      return f(std::uint8_t{});
    case kolo::DataType::float16:
      return f(kolo::float16{});
    case kolo::DataType::bfloat16:
      return f(kolo::bfloat16{});
    default:
      throw std::logic_error("inproc harness: dtype not covered");
  }
}

// ---------------------------------------------------------------- one matrix cell per collective

// Allreduce on `count` elements: every case (count <= 1000) or int32 sum (the large count), in
// place and out of place; the result exact on every rank. `want` (if set) is the algorithm that
// must have run.
inline void allreduce_cell(Comm& c, int r, std::size_t count, Failures& f, const std::string& label,
                           std::optional<kolo::AllreduceAlgorithm> want) {
  const int n = c.size();
  const auto& cases = allreduce_cases();
  const std::size_t ncases = count > 1000 ? 1 : cases.size();
  std::vector<std::byte> in, out;
  for (std::size_t k = 0; k < ncases; ++k) {
    const AllreduceCase& cs = cases[k];
    for (int in_place = 0; in_place < 2; ++in_place) {
      if (count > 1000 && k > 0) break;
      with_type(cs.dtype, [&](auto tag) {
        using T = decltype(tag);
        fill_case<T>(in, cs, r, n, count);
        const std::string where = label + " " + cs.name + (in_place ? " in place" : "") +
                                  ", count " + std::to_string(count) + ", rank " +
                                  std::to_string(r) + "/" + std::to_string(n);
        if (in_place) {
          c.allreduce(kolo::TensorView(in.data(), count, cs.dtype), cs.op);
          check_case<T>(in, cs, n, count, where, f);
        } else {
          out.assign(count * sizeof(T), std::byte{0x5a});
          c.allreduce(kolo::TensorView(in.data(), count, cs.dtype),
                      kolo::TensorView(out.data(), count, cs.dtype), cs.op);
          check_case<T>(out, cs, n, count, where, f);
          // The input is untouched out of place (checked on the small counts: the large one
          // is the sanitizer runs' biggest cost).
          if (count <= 1000) {
            std::vector<std::byte> again;
            fill_case<T>(again, cs, r, n, count);
            if (again != in) f.add(where + ": the input changed");
          }
        }
        if (want && c.last_allreduce_algorithm() != *want) {
          f.add(where + ": ran " + kolo::algorithm_name(c.last_allreduce_algorithm()) +
                ", expected " + kolo::algorithm_name(*want));
        }
      });
    }
  }
}

// Float sums of random values spread over six decades: every rank must end with the same bits.
// `results[r]` receives rank r's result (compared by the caller after the threads joined).
inline void allreduce_bits(Comm& c, int r, std::vector<std::vector<float>>& results) {
  std::mt19937 gen(static_cast<unsigned>(1234 + r));
  std::uniform_real_distribution<float> mant(1.0f, 10.0f);
  std::uniform_int_distribution<int> exp(-3, 3);
  std::vector<float> v(1000);
  for (float& x : v) x = mant(gen) * std::pow(10.0f, static_cast<float>(exp(gen)));
  c.allreduce(v);
  results[static_cast<std::size_t>(r)] = std::move(v);
}

inline void check_same_bits(const std::vector<std::vector<float>>& results,
                            const std::string& label) {
  for (std::size_t r = 1; r < results.size(); ++r) {
    CHECK_MESSAGE(std::memcmp(results[r].data(), results[0].data(), results[0].size() * 4) == 0,
                  label, ": rank ", r, "'s float sum differs from rank 0's in some bit");
  }
}

inline std::int32_t bcast_value(int root, std::size_t i) {
  return static_cast<std::int32_t>(root * 100003 + static_cast<int>(i % 65521));
}

// Broadcast of `count` int32 from roots 0, n/2, n-1 (the large count: n-1 only).
inline void broadcast_cell(Comm& c, int r, std::size_t count, Failures& f, const std::string& label,
                           std::optional<kolo::BroadcastAlgorithm> want) {
  const int n = c.size();
  std::vector<int> roots = {n - 1};
  if (count <= 1000) roots = {0, n / 2, n - 1};
  std::vector<std::int32_t> buf(count);
  for (int root : roots) {
    for (std::size_t i = 0; i < count; ++i) buf[i] = r == root ? bcast_value(root, i) : -7;
    c.broadcast(buf, root);
    const std::string where = label + " count " + std::to_string(count) + " root " +
                              std::to_string(root) + ", rank " + std::to_string(r) + "/" +
                              std::to_string(n);
    for (std::size_t i = 0; i < count; ++i) {
      if (buf[i] != bcast_value(root, i)) {
        f.add(where + ": element " + std::to_string(i) + " is " + std::to_string(buf[i]));
        break;
      }
    }
    if (want && c.last_broadcast_algorithm() != *want) {
      f.add(where + ": ran " + kolo::algorithm_name(c.last_broadcast_algorithm()));
    }
  }
}

inline std::int32_t gather_value(int r, std::size_t i) {
  return static_cast<std::int32_t>(r * 1000003 + static_cast<int>(i % 999983));
}

// allgatherv of `count` elements in all, split as evenly as possible (some ranks give none
// when count < n), and allgather of count / n (count itself when smaller than n) per rank.
inline void allgather_cell(Comm& c, int r, std::size_t count, Failures& f, const std::string& label,
                           std::optional<kolo::AllgatherAlgorithm> want) {
  const int n = c.size();
  const std::string where0 = label + " count " + std::to_string(count) + ", rank " +
                             std::to_string(r) + "/" + std::to_string(n);
  std::vector<std::size_t> counts(static_cast<std::size_t>(n));
  for (int q = 0; q < n; ++q)
    counts[static_cast<std::size_t>(q)] = kolo::even_block(count, n, q).count;
  std::vector<std::int32_t> mine(counts[static_cast<std::size_t>(r)]);
  for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = gather_value(r, i);
  std::vector<std::int32_t> all(count, -1);
  c.allgatherv(kolo::TensorView(mine.data(), mine.size(), kolo::DataType::int32),
               kolo::TensorView(all.data(), all.size(), kolo::DataType::int32), counts);
  std::size_t at = 0;
  for (int q = 0; q < n; ++q) {
    for (std::size_t i = 0; i < counts[static_cast<std::size_t>(q)]; ++i, ++at) {
      if (all[at] != gather_value(q, i)) {
        f.add(where0 + " allgatherv: block " + std::to_string(q) + " element " + std::to_string(i));
        q = n;
        break;
      }
    }
  }
  if (want && c.last_allgather_algorithm() != *want) f.add(where0 + ": allgatherv ran another");

  const std::size_t per =
      count < static_cast<std::size_t>(n) ? count : count / static_cast<std::size_t>(n);
  std::vector<std::int32_t> in(per), out(per * static_cast<std::size_t>(n), -1);
  for (std::size_t i = 0; i < per; ++i) in[i] = gather_value(r, i);
  c.allgather(kolo::TensorView(in.data(), per, kolo::DataType::int32),
              kolo::TensorView(out.data(), out.size(), kolo::DataType::int32));
  for (std::size_t k = 0; k < out.size(); ++k) {
    const int q = static_cast<int>(k / std::max<std::size_t>(per, 1));
    if (out[k] != gather_value(q, k % per)) {
      f.add(where0 + " allgather: element " + std::to_string(k));
      break;
    }
  }
  if (want && c.last_allgather_algorithm() != *want) f.add(where0 + ": allgather ran another");
}

// reduce_scatter: out holds count / n (count itself when smaller than n) elements; int32 sum in
// place and out of place, and float64 average out of place (small counts).
inline void reduce_scatter_cell(Comm& c, int r, std::size_t count, Failures& f,
                                const std::string& label,
                                std::optional<kolo::ReduceScatterAlgorithm> want) {
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t per = count < un ? count : count / un;
  const std::string where = label + " count " + std::to_string(count) + " (" + std::to_string(per) +
                            " per rank), rank " + std::to_string(r) + "/" + std::to_string(n);
  std::vector<std::int32_t> in(per * un), out(per, -1);
  auto fill = [&] {
    for (std::size_t i = 0; i < in.size(); ++i)
      in[i] = static_cast<std::int32_t>(int_value(r, i, n));
  };
  auto check = [&](const std::int32_t* res, const char* how) {
    for (std::size_t i = 0; i < per; ++i) {
      const std::size_t g = static_cast<std::size_t>(r) * per + i;
      if (res[i] != static_cast<std::int32_t>(int_sum(g, n))) {
        f.add(where + " " + how + ": element " + std::to_string(i) + " is " +
              std::to_string(res[i]));
        return;
      }
    }
  };
  fill();
  c.reduce_scatter(kolo::TensorView(in.data(), in.size(), kolo::DataType::int32),
                   kolo::TensorView(out.data(), per, kolo::DataType::int32));
  check(out.data(), "out of place");
  fill();
  std::int32_t* block = in.data() + static_cast<std::size_t>(r) * per;
  c.reduce_scatter(kolo::TensorView(in.data(), in.size(), kolo::DataType::int32),
                   kolo::TensorView(block, per, kolo::DataType::int32));
  check(block, "in place");
  if (count <= 1000) {
    std::vector<double> din(per * un), dout(per);
    for (std::size_t i = 0; i < din.size(); ++i)
      din[i] = static_cast<double>((r + 1) * static_cast<int>(i % 13 + 1));
    c.reduce_scatter(kolo::TensorView(din.data(), din.size(), kolo::DataType::float64),
                     kolo::TensorView(dout.data(), per, kolo::DataType::float64),
                     kolo::ReduceOp::average);
    for (std::size_t i = 0; i < per; ++i) {
      const std::size_t g = static_cast<std::size_t>(r) * per + i;
      if (dout[i] != (n + 1) / 2.0 * static_cast<double>(g % 13 + 1)) {
        f.add(where + " average: element " + std::to_string(i));
        break;
      }
    }
  }
  if (want && c.last_reduce_scatter_algorithm() != *want) f.add(where + ": ran another");
}

inline std::int32_t a2a_value(int from, int to, std::size_t k) {
  return static_cast<std::int32_t>(from * 1000003 + to * 10007 + static_cast<int>(k % 9973));
}

// alltoall: blocks of count / n (count itself when smaller than n) elements.
inline void alltoall_cell(Comm& c, int r, std::size_t count, Failures& f, const std::string& label,
                          std::optional<kolo::AlltoallAlgorithm> want) {
  const int n = c.size();
  const auto un = static_cast<std::size_t>(n);
  const std::size_t per = count < un ? count : count / un;
  std::vector<std::int32_t> in(per * un), out(per * un, -1);
  for (int to = 0; to < n; ++to)
    for (std::size_t k = 0; k < per; ++k)
      in[static_cast<std::size_t>(to) * per + k] = a2a_value(r, to, k);
  c.alltoall(kolo::TensorView(in.data(), in.size(), kolo::DataType::int32),
             kolo::TensorView(out.data(), out.size(), kolo::DataType::int32));
  const std::string where = label + " count " + std::to_string(count) + ", rank " +
                            std::to_string(r) + "/" + std::to_string(n);
  for (int from = 0; from < n; ++from) {
    for (std::size_t k = 0; k < per; ++k) {
      if (out[static_cast<std::size_t>(from) * per + k] != a2a_value(from, r, k)) {
        f.add(where + ": block " + std::to_string(from) + " element " + std::to_string(k));
        from = n;
        break;
      }
    }
  }
  if (want && c.last_alltoall_algorithm() != *want) f.add(where + ": ran another");
}

// ---------------------------------------------------------------- the matrix over a registry

// Every registered algorithm of a collective (ids in registry order) with its name.
template <class Algo>
std::vector<std::pair<Algo, std::string>> registered() {
  std::vector<std::pair<Algo, std::string>> out;
  const auto entries = kolo::algorithm_entries<Algo>();
  for (std::size_t i = 0; i < entries.size(); ++i) {
    out.emplace_back(static_cast<Algo>(i), entries[i]->name);
  }
  return out;
}

// Runs `cell` for every count of the matrix on n ranks with algorithm `a` forced, and checks it.
template <class Algo, class Cell>
void run_matrix(int n, Algo a, const std::string& name, Cell cell) {
  Failures f;
  const std::string label = std::string(kolo::AlgorithmTraits<Algo>::name) + "/" + name;
  run_ranks(n, [&](Comm& c, int r) {
    c.selector().force(a);
    for (std::size_t count : kCounts) cell(c, r, count, f, label, std::optional<Algo>(a));
  });
  CHECK_MESSAGE(f.count() == 0, label, " on ", n, " ranks: ", f.count(), " failures\n", f.text());
}

}  // namespace inproc
