// compression_bench — what gradient compression buys and costs (issue 6's benchmark).
//
//   compression_bench convert [--mib 64] [--iters 10] [--json out.json]
//       Single process. Conversion throughput of the compression policies (F16C path where the
//       CPU has it, and the portable scalar path) next to memcpy of the same fp32 buffer, out of
//       cache. GB = 1e9; "in" counts the fp32 bytes read per second, "traffic" read + written.
//       Every conversion's output is then checked (#wrong; exit status 1 on any wrong element):
//       the copy and the F16C path bit for bit against the scalar one, the scalar fp16 and the
//       bf16 results within half a unit in the last place of the fp32 input, decompression bit
//       for bit. --inject-wrong 1 corrupts one element of each output first (testing aid).
//
//   KOLO_TRANSPORT=tcp kolo-run -np 2 compression_bench allreduce [--mib 64] [--iters 5]
//                        [--reps 3] [--tensors 1] [--raw 1] [--json f]
//       Wall time of an Engine allreduce (average) of `mib` MiB of fp32 gradients (split into
//       `tensors` equal tensors, fused by the engine) with compression none, fp16 and bf16, and
//       the fp16/none ratio (target: <= 0.6). Also the raw Communicator allreduce of the same
//       element count as fp32 and as fp16 (what the wire and the reduction cost without the
//       conversions; --raw 0 leaves it out). Each configuration runs `reps` times, interleaved
//       with the others (a shared machine's load drifts), `iters` timed iterations after one
//       warm-up each; an iteration's time is the slowest rank's. Reported: median and minimum
//       over all iterations. Inputs are small integers, so every result is exact and checked
//       (#wrong); exit status 1 on any wrong element.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <kolo/compression/compressor.hpp>
#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Opts {
  std::string mode;
  double mib = 64;
  int iters = 0;
  std::size_t tensors = 1;
  std::string json;
  bool raw = true;            // allreduce: also time the bare Communicator
  int reps = 3;               // allreduce: interleaved repetitions of every configuration
  bool inject_wrong = false;  // convert: corrupt one element of each output before its check
};

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c + "\n";
}

Opts parse(int argc, char** argv) {
  Opts o;
  if (argc < 2) throw kolo::ConfigError("usage: compression_bench convert|allreduce [options]");
  o.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) throw kolo::ConfigError(k + " needs a value");
    const std::string v = argv[++i];
    if (k == "--mib") {
      o.mib = std::atof(v.c_str());
    } else if (k == "--iters") {
      o.iters = std::atoi(v.c_str());
    } else if (k == "--tensors") {
      o.tensors = static_cast<std::size_t>(std::atol(v.c_str()));
    } else if (k == "--json") {
      o.json = v;
    } else if (k == "--reps") {
      o.reps = std::max(1, std::atoi(v.c_str()));
    } else if (k == "--inject-wrong") {
      o.inject_wrong = v != "0";
    } else if (k == "--raw") {
      o.raw = v != "0";
    } else {
      throw kolo::ConfigError("unknown option " + k);
    }
  }
  if (o.mode != "convert" && o.mode != "allreduce") {
    throw kolo::ConfigError("mode must be convert or allreduce, not " + o.mode);
  }
  if (!(o.mib > 0) || o.tensors < 1) throw kolo::ConfigError("--mib and --tensors must be > 0");
  return o;
}

// ---------------- conversion throughput ----------------

struct Row {
  std::string name;
  double seconds, in_gbs, traffic_gbs;
};

int run_convert(const Opts& o) {
  const std::size_t n = static_cast<std::size_t>(o.mib * (1 << 20)) / 4;
  const int iters = o.iters > 0 ? o.iters : 10;
  std::vector<float> src(n), back(n);
  std::vector<std::uint16_t> wire(n);
  std::vector<float> copy(n);
  for (std::size_t i = 0; i < n; ++i) {
    src[i] = static_cast<float>(static_cast<int>(i % 2001) - 1000) * 0.001f;
  }
  auto time = [&](const std::string& name, std::size_t out_bytes, auto&& f) {
    f();  // warm-up: page faults out of the measurement
    std::vector<double> t;
    for (int k = 0; k < iters; ++k) {
      const auto t0 = clock_type::now();
      f();
      t.push_back(seconds_since(t0));
    }
    const double s = median(t);
    const double in = static_cast<double>(n) * 4;
    return Row{name, s, in / s / 1e9, (in + static_cast<double>(out_bytes)) / s / 1e9};
  };
  // The checks, after each timed row: count the elements where ok(i) fails, the first named.
  std::size_t wrong = 0;
  // --inject-wrong flips an exponent bit of element 0 (its last byte: x86 is little-endian).
  auto check = [&](const char* what, auto* out, auto&& ok) {
    if (o.inject_wrong) reinterpret_cast<unsigned char*>(out)[sizeof(*out) - 1] ^= 0x40;
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (ok(i)) continue;
      if (bad++ == 0) std::fprintf(stderr, "compression_bench: %s: element %zu wrong\n", what, i);
    }
    wrong += bad;
  };
  auto bits_of = [](float x) {
    std::uint32_t u;
    std::memcpy(&u, &x, 4);
    return u;
  };
  auto same = [&](float a, float b) { return bits_of(a) == bits_of(b); };
  // Within half a unit in the last place (2^-11 of |x| for fp16, 2^-8 for bf16: the inputs are
  // normal in both), so a rounding in the wrong direction or a wrong exponent is caught.
  auto rounded = [](float got, float x, float unit) {
    return std::fabs(static_cast<double>(got) - static_cast<double>(x)) <=
           std::fabs(static_cast<double>(x)) * static_cast<double>(unit) * 0.5;
  };
  std::vector<std::uint16_t> scalar_wire(n);
  for (std::size_t i = 0; i < n; ++i) scalar_wire[i] = kolo::detail::float_to_half_bits(src[i]);
  std::vector<Row> rows;
  rows.push_back(time("memcpy fp32", n * 4, [&] { std::memcpy(copy.data(), src.data(), n * 4); }));
  check("memcpy", copy.data(), [&](std::size_t i) { return same(copy[i], src[i]); });
  rows.push_back(time("fp16 compress (dispatch)", n * 2,
                      [&] { kolo::Fp16Compressor::compress(src.data(), wire.data(), n, 1.0f); }));
  check("fp16 compress (dispatch)", wire.data(),
        [&](std::size_t i) { return wire[i] == scalar_wire[i]; });
  // Decompression reads 2 bytes and writes 4 per element: "in" is reported per fp32 element.
  rows.push_back(time("fp16 decompress (dispatch)", n * 2, [&] {
    kolo::Fp16Compressor::decompress(wire.data(), back.data(), n, 1.0f);
  }));
  check("fp16 decompress (dispatch)", back.data(), [&](std::size_t i) {
    return same(back[i], kolo::detail::half_bits_to_float(scalar_wire[i]));
  });
  rows.push_back(time("fp16 compress (scalar)", n * 2, [&] {
    for (std::size_t i = 0; i < n; ++i) wire[i] = kolo::detail::float_to_half_bits(src[i]);
  }));
  check("fp16 compress (scalar)", wire.data(), [&](std::size_t i) {
    return rounded(kolo::detail::half_bits_to_float(wire[i]), src[i], 0x1p-10f);
  });
  rows.push_back(time("fp16 decompress (scalar)", n * 2, [&] {
    for (std::size_t i = 0; i < n; ++i) back[i] = kolo::detail::half_bits_to_float(wire[i]);
  }));
  check("fp16 decompress (scalar)", back.data(),
        [&](std::size_t i) { return rounded(back[i], src[i], 0x1p-10f); });
  rows.push_back(time("bf16 compress", n * 2,
                      [&] { kolo::Bf16Compressor::compress(src.data(), wire.data(), n, 1.0f); }));
  check("bf16 compress", wire.data(), [&](std::size_t i) {
    const float got = [&] {
      const std::uint32_t u = static_cast<std::uint32_t>(wire[i]) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }();
    return rounded(got, src[i], 0x1p-7f);
  });
  rows.push_back(time("bf16 decompress", n * 2, [&] {
    kolo::Bf16Compressor::decompress(wire.data(), back.data(), n, 1.0f);
  }));
  check("bf16 decompress", back.data(), [&](std::size_t i) {
    return bits_of(back[i]) == static_cast<std::uint32_t>(wire[i]) << 16;
  });
  bool f16c = false;
#ifdef KOLO_HAVE_F16C_DISPATCH
  f16c = kolo::detail::cpu_has_f16c();
#endif
  const double memcpy_traffic = rows[0].traffic_gbs;
  std::printf("# compression_bench convert: %zu fp32 elements (%.0f MiB), median of %d, F16C %s\n",
              n, o.mib, iters, f16c ? "yes" : "no");
  std::printf("# %-28s %10s %10s %12s %14s\n", "what", "time(ms)", "in(GB/s)", "traffic(GB/s)",
              "traffic/memcpy");
  for (const Row& r : rows) {
    std::printf("  %-28s %10.2f %10.2f %12.2f %14.2f\n", r.name.c_str(), r.seconds * 1e3, r.in_gbs,
                r.traffic_gbs, r.traffic_gbs / memcpy_traffic);
  }
  if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << "{\"mode\":\"convert\",\"elements\":" << n << ",\"f16c\":" << (f16c ? "true" : "false")
      << ",\"rows\":[";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      f << (i ? "," : "") << "{\"name\":\"" << rows[i].name << "\",\"seconds\":" << rows[i].seconds
        << ",\"in_gbs\":" << rows[i].in_gbs << ",\"traffic_gbs\":" << rows[i].traffic_gbs << "}";
    }
    f << "],\"wrong\":" << wrong << "}\n";
  }
  std::printf("# wrong: %zu %s\n", wrong, wrong ? "FAILED" : "OK");
  return wrong ? 1 : 0;
}

// ---------------- engine allreduce ----------------

// Rank r's element i: a small integer, so sums are exact in fp32, fp16 and bf16 alike.
float value(int rank, std::size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 5));
}

struct Series {
  std::string name;
  std::vector<double> seconds;
  std::size_t wrong = 0;
};

void time_engine(const Opts& o, Series& s, const char* compression, std::size_t n) {
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = kolo::CompressionPolicy::parse(compression);
  eo.fusion_threshold = std::max<std::size_t>(eo.fusion_threshold, n * 4);
  kolo::Engine<> engine(kolo::Communicator<>::from_env(), eo);
  const int size = engine.size(), rank = engine.rank();
  const std::size_t per = n / o.tensors;
  std::vector<float> data(per * o.tensors);
  const int iters = o.iters > 0 ? o.iters : 5;
  std::vector<double> t;
  for (int k = -1; k < iters; ++k) {  // k = -1: warm-up (negotiation, page faults)
    for (std::size_t i = 0; i < data.size(); ++i) data[i] = value(rank, i);
    std::vector<kolo::Handle> hs;
    // Start together: a tiny allreduce through the engine is the barrier.
    float go = 1;
    engine.allreduce_async("barrier", kolo::TensorView(&go, 1, kolo::DataType::float32)).wait();
    const auto t0 = clock_type::now();
    for (std::size_t j = 0; j < o.tensors; ++j) {
      hs.push_back(engine.allreduce_async(
          "grad" + std::to_string(j),
          kolo::TensorView(data.data() + j * per, per, kolo::DataType::float32),
          kolo::ReduceOp::average));
    }
    for (auto& h : hs) h.wait();
    if (k >= 0) t.push_back(seconds_since(t0));
    if (k == 0) {
      for (std::size_t i = 0; i < data.size(); ++i) {
        float want = 0;
        for (int r = 0; r < size; ++r) want += value(r, i);
        want /= static_cast<float>(size);
        s.wrong += std::fabs(data[i] - want) > 1e-6f * std::max(1.0f, std::fabs(want));
      }
    }
  }
  engine.allreduce_async("times", kolo::TensorView(std::span<double>(t)), kolo::ReduceOp::max)
      .wait();
  s.seconds.insert(s.seconds.end(), t.begin(), t.end());
}

// `wire`: float32 through Communicator::allreduce_compressed (converted on the wire).
void time_raw(const Opts& o, Series& s, kolo::DataType dtype, std::size_t n,
              const kolo::CompressionPolicy* wire = nullptr) {
  auto comm = kolo::Communicator<>::from_env();
  std::vector<std::byte> buf(n * kolo::dtype_size(dtype));
  std::vector<double> t;
  const int iters = o.iters > 0 ? o.iters : 5;
  for (int k = -1; k < iters; ++k) {
    // Ones, not zeros: the scalar fp16 conversion has a fast path for zero.
    if (dtype == kolo::DataType::float16) {
      std::vector<std::uint16_t> one(n, 0x3c00);
      std::memcpy(buf.data(), one.data(), buf.size());
    } else {
      std::vector<float> one(n, 1.0f);
      std::memcpy(buf.data(), one.data(), buf.size());
    }
    comm.barrier();
    const auto t0 = clock_type::now();
    if (wire) {
      comm.allreduce_compressed(kolo::TensorView(buf.data(), n, dtype),
                                kolo::TensorView(buf.data(), n, dtype), kolo::ReduceOp::sum, *wire);
    } else {
      comm.allreduce(kolo::TensorView(buf.data(), n, dtype), kolo::ReduceOp::sum);
    }
    if (k >= 0) t.push_back(seconds_since(t0));
  }
  comm.allreduce(kolo::TensorView(std::span<double>(t)), kolo::ReduceOp::max);
  s.seconds.insert(s.seconds.end(), t.begin(), t.end());
}

int run_allreduce(const Opts& o) {
  const std::size_t n = static_cast<std::size_t>(o.mib * (1 << 20)) / 4;
  std::vector<Series> rows = {
      {"engine none", {}, 0},          {"engine fp16", {}, 0},
      {"engine bf16", {}, 0},          {"communicator float32", {}, 0},
      {"communicator float16", {}, 0}, {"communicator fp32, fp16 wire", {}, 0}};
  // Interleaved repetitions: on a shared machine the load drifts, and each configuration should
  // see the same mix of it. With KOLO_TIMELINE set, the file shows the last engine's phases
  // (each engine rewrites it): fp16 runs last.
  for (int rep = 0; rep < o.reps; ++rep) {
    if (o.raw) {
      time_raw(o, rows[3], kolo::DataType::float32, n);
      time_raw(o, rows[4], kolo::DataType::float16, n);
      const auto fp16 = kolo::CompressionPolicy::parse("fp16");
      time_raw(o, rows[5], kolo::DataType::float32, n, &fp16);
    }
    time_engine(o, rows[0], "none", n);
    time_engine(o, rows[2], "bf16", n);
    time_engine(o, rows[1], "fp16", n);
  }
  if (!o.raw) rows.resize(3);
  auto comm_info = kolo::Topology::from_env();
  std::size_t wrong = 0;
  for (const auto& r : rows) wrong += r.wrong;
  if (comm_info.rank == 0) {
    const char* transport = std::getenv("KOLO_TRANSPORT");
    std::printf(
        "# compression_bench allreduce: %d ranks, transport %s, %zu fp32 elements (%.0f MiB) in "
        "%zu tensor(s), average; %d interleaved repetitions x %d iterations; load average %s",
        comm_info.size, transport ? transport : "routed (default)", n, o.mib, o.tensors, o.reps,
        o.iters > 0 ? o.iters : 5, load_average().c_str());
    std::printf("# %-29s %12s %10s %16s %8s\n", "what", "median(ms)", "min(ms)", "algbw(GB/s,med)",
                "#wrong");
    for (const auto& r : rows) {
      std::printf("  %-29s %12.2f %10.2f %16.2f %8zu\n", r.name.c_str(), median(r.seconds) * 1e3,
                  *std::min_element(r.seconds.begin(), r.seconds.end()) * 1e3,
                  static_cast<double>(n) * 4 / median(r.seconds) / 1e9, r.wrong);
    }
    auto best = [](const Series& x) {
      return *std::min_element(x.seconds.begin(), x.seconds.end());
    };
    const double ratio = median(rows[1].seconds) / median(rows[0].seconds);
    std::printf(
        "# fp16 / none wall time: %.3f median (target <= 0.6: %s), %.3f best-of; bf16 / none: "
        "%.3f median\n",
        ratio, ratio <= 0.6 ? "met" : "NOT met", best(rows[1]) / best(rows[0]),
        median(rows[2].seconds) / median(rows[0].seconds));
    std::printf("# Out of bounds values : %zu %s\n", wrong, wrong ? "FAILED" : "OK");
    if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << "{\"mode\":\"allreduce\",\"ranks\":" << comm_info.size << ",\"elements\":" << n
        << ",\"tensors\":" << o.tensors << ",\"fp16_over_none\":" << ratio << ",\"rows\":[";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        f << (i ? "," : "") << "{\"name\":\"" << rows[i].name
          << "\",\"median_seconds\":" << median(rows[i].seconds)
          << ",\"min_seconds\":" << best(rows[i]) << ",\"wrong\":" << rows[i].wrong << "}";
      }
      f << "]}\n";
    }
  }
  return wrong ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Opts o = parse(argc, argv);
    return o.mode == "convert" ? run_convert(o) : run_allreduce(o);
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "compression_bench: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
}
