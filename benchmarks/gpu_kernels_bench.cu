// gpu_kernels_bench.cu — bandwidth of kolo's device fusion kernels (kolo/cuda/kernels.cuh)
// against a device-to-device cudaMemcpyAsync of the same size, on one GPU.
//
//   kolo-gpu-kernels-bench [--mib 64] [--reps 30] [--json PATH]
//
// Every row is timed with a pair of CUDA events on one stream, median of --reps runs after
// warm-up: "us per call" from 10 calls queued back to back (the GPU's time; launch latency
// hidden), "alone" from one call (launch latency and, for pack/unpack, the descriptor upload
// included). For pack/unpack a call is everything the engine pays: descriptor upload (batches
// of more than 120 tensors) and the one kernel. Bandwidth counts the bytes each kernel must read
// and write (a copy of B bytes moves 2B; a compressing pack of N floats reads 4N and writes 2N;
// reduce reads dst and src and writes dst) and is compared with the D2D copy's. Many-tensor rows
// place tensors as separate allocations do (256-byte aligned) and pack them densely, as the
// engine does; "16 B offsets" rows round each buffer offset up to 16 bytes, which lets every
// tensor use vector accesses. Exits 77 (SKIP) when no CUDA device is present.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "kolo/core/dtype.hpp"
#include "kolo/cuda/kernels.cuh"

namespace {

using kolo::DataType;
using kolo::ReduceOp;
using kolo::cuda::FusionItem;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Row {
  std::string name;
  double bytes;     // read + written by one call
  double us;        // median per call, calls back to back (launch latency hidden)
  double alone_us;  // median of one call alone (launch latency included)
  double host_us;   // median host time per call to queue the calls back to back
};

struct Timing {
  double gpu_us, host_us;
};

// Medians over `reps` of the time per call of `inner` calls queued back to back: on the GPU
// (events) and on the host (queueing them).
template <class F>
Timing median_us(cudaStream_t s, int reps, int inner, F&& f) {
  cudaEvent_t a, b;
  ok(cudaEventCreate(&a), "cudaEventCreate");
  ok(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> t, h;
  for (int i = 0; i < reps; ++i) {
    ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    ok(cudaEventRecord(a, s), "cudaEventRecord");
    const auto h0 = std::chrono::steady_clock::now();
    for (int k = 0; k < inner; ++k) f();
    const auto h1 = std::chrono::steady_clock::now();
    ok(cudaEventRecord(b, s), "cudaEventRecord");
    ok(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(1000.0 * ms / inner);
    h.push_back(std::chrono::duration<double, std::micro>(h1 - h0).count() / inner);
  }
  (void)cudaEventDestroy(a);
  (void)cudaEventDestroy(b);
  const auto median = [](std::vector<double>& v) {
    std::sort(v.begin(), v.end());
    return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
  };
  return {median(t), median(h)};
}

// Element counts of `n` tensors summing to `total`: equal, or log-normally distributed.
std::vector<std::size_t> tensor_sizes(std::size_t n, std::size_t total, bool random) {
  std::vector<std::size_t> c(n, total / n);
  for (std::size_t i = 0; i < total % n; ++i) ++c[i];
  if (!random) return c;
  std::mt19937_64 rng(42);
  std::lognormal_distribution<double> d(0.0, 1.5);
  std::vector<double> w(n);
  double sum = 0;
  for (double& x : w) sum += (x = d(rng));
  std::size_t used = 0;
  for (std::size_t i = 0; i < n; ++i) {
    c[i] =
        std::max<std::size_t>(1, static_cast<std::size_t>(w[i] / sum * static_cast<double>(total)));
    used += c[i];
  }
  // Put the rounding difference on the largest tensor.
  auto big = std::max_element(c.begin(), c.end());
  if (used <= total)
    *big += total - used;
  else
    *big -= std::min(*big - 1, used - total);
  return c;
}

// Items for `counts`: tensors at 256-byte aligned places of `arena` (elements of tensor_size
// bytes), buffer offsets dense or rounded up to 16 bytes (elements of wire_size bytes).
// `pack` sets src, otherwise dst.
std::vector<FusionItem> make_items(const std::vector<std::size_t>& counts, std::byte* arena,
                                   std::size_t tensor_size, std::size_t wire_size, bool pack,
                                   bool aligned_offsets) {
  std::vector<FusionItem> items;
  std::size_t pos = 0, off = 0;
  for (std::size_t c : counts) {
    FusionItem it;
    if (pack)
      it.src = arena + pos;
    else
      it.dst = arena + pos;
    it.count = c;
    if (aligned_offsets) off = (off * wire_size + 15) / 16 * 16 / wire_size;
    it.offset = off;
    items.push_back(it);
    pos += (c * tensor_size + 255) / 256 * 256;
    off += c;
  }
  return items;
}

std::size_t arena_bytes(const std::vector<std::size_t>& counts, std::size_t tensor_size) {
  std::size_t pos = 0;
  for (std::size_t c : counts) pos += (c * tensor_size + 255) / 256 * 256;
  return pos;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 64;
  int reps = 30;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::strtoull(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--mib 64] [--reps 30] [--json PATH]\n", argv[0]);
      return 2;
    }
  }
  if (mib == 0) mib = 1;

  int devices = 0;
  const cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device (%s)\n",
                e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount reported 0 devices");
    return 77;
  }
  int dev = 0;
  ok(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");

  cudaStream_t s;
  ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");

  const std::size_t bytes = mib << 20;
  const std::size_t n = bytes / 4;  // float32 elements
  const std::vector<std::size_t> equal1000 = tensor_sizes(1000, n, false);
  const std::vector<std::size_t> random1000 = tensor_sizes(1000, n, true);
  const std::size_t arena = std::max(arena_bytes(equal1000, 4), arena_bytes(random1000, 4)) + 4096;
  std::byte *a = nullptr, *b = nullptr, *c = nullptr;
  ok(cudaMalloc(reinterpret_cast<void**>(&a), arena), "cudaMalloc");
  ok(cudaMalloc(reinterpret_cast<void**>(&b), arena), "cudaMalloc");
  ok(cudaMalloc(reinterpret_cast<void**>(&c), arena), "cudaMalloc");
  {  // finite values of moderate size everywhere (float32 and, read as 16-bit, halves)
    std::vector<float> h(arena / 4);
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    for (float& x : h) x = u(rng);
    ok(cudaMemcpy(a, h.data(), arena, cudaMemcpyHostToDevice), "upload");
    ok(cudaMemcpy(b, h.data(), arena, cudaMemcpyHostToDevice), "upload");
    ok(cudaMemcpy(c, h.data(), arena, cudaMemcpyHostToDevice), "upload");
  }

  std::vector<Row> rows;
  const auto add = [&](const std::string& name, double moved, auto&& f) {
    for (int i = 0; i < 5; ++i) f();  // warm-up: first launches, pool growth, clocks
    const Timing many = median_us(s, reps, 10, f);
    const Timing alone = median_us(s, reps, 1, f);
    rows.push_back({name, moved, many.gpu_us, alone.gpu_us, many.host_us});
    std::fprintf(stderr, "  %-60s %9.1f us %9.1f us alone %7.1f us host\n", name.c_str(),
                 many.gpu_us, alone.gpu_us, many.host_us);
  };
  const double B = static_cast<double>(bytes);
  const double N = static_cast<double>(n);

  add("cudaMemcpyAsync D2D", 2 * B,
      [&] { ok(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "cudaMemcpyAsync"); });

  add("cudaMemsetAsync (writes only)", B,
      [&] { ok(cudaMemsetAsync(b, 0, bytes, s), "cudaMemsetAsync"); });
  {  // what uploading 1000 descriptors (32 KB) costs the stream, from pageable or pinned memory
    std::vector<std::byte> pageable(32000);
    void* pinned = nullptr;
    ok(cudaMallocHost(&pinned, 32000), "cudaMallocHost");
    add("H2D cudaMemcpyAsync 32 KB, pageable", 32000,
        [&] { ok(cudaMemcpyAsync(c, pageable.data(), 32000, cudaMemcpyHostToDevice, s), "H2D"); });
    add("H2D cudaMemcpyAsync 32 KB, pinned", 32000,
        [&] { ok(cudaMemcpyAsync(c, pinned, 32000, cudaMemcpyHostToDevice, s), "H2D"); });
    ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    (void)cudaFreeHost(pinned);
  }

  const FusionItem one_pack{a, nullptr, n, 0};
  const FusionItem one_unpack{nullptr, b, n, 0};
  add("pack fp32->fp32, 1 tensor", 2 * B,
      [&] { kolo::cuda::pack(&one_pack, 1, DataType::float32, DataType::float32, c, 1.0, s); });
  add("pack fp32->fp32 x0.5, 1 tensor", 2 * B,
      [&] { kolo::cuda::pack(&one_pack, 1, DataType::float32, DataType::float32, c, 0.5, s); });
  for (std::size_t t : {120, 121}) {  // descriptors in the kernel's parameters, or uploaded
    const auto items = make_items(tensor_sizes(t, n, false), a, 4, 4, true, true);
    add("pack fp32->fp32, " + std::to_string(t) + " tensors, 16 B offsets", 2 * B, [&] {
      kolo::cuda::pack(items.data(), items.size(), DataType::float32, DataType::float32, c, 1.0, s);
    });
  }
  for (bool aligned : {false, true}) {
    const auto items = make_items(equal1000, a, 4, 4, true, aligned);
    add(std::string("pack fp32->fp32, 1000 tensors") + (aligned ? ", 16 B offsets" : ""), 2 * B,
        [&] {
          kolo::cuda::pack(items.data(), items.size(), DataType::float32, DataType::float32, c, 1.0,
                           s);
        });
  }
  add("pack fp32->fp16 x0.5 (compress), 1 tensor", 6 * N,
      [&] { kolo::cuda::pack(&one_pack, 1, DataType::float32, DataType::float16, c, 0.5, s); });
  add("pack fp32->bf16 x0.5 (compress), 1 tensor", 6 * N,
      [&] { kolo::cuda::pack(&one_pack, 1, DataType::float32, DataType::bfloat16, c, 0.5, s); });
  add("unpack fp16->fp32 x0.5/4 (decompress), 1 tensor", 6 * N, [&] {
    kolo::cuda::unpack(&one_unpack, 1, DataType::float16, DataType::float32, c, 0.5, 4, s);
  });
  add("unpack bf16->fp32 x0.5/4 (decompress), 1 tensor", 6 * N, [&] {
    kolo::cuda::unpack(&one_unpack, 1, DataType::bfloat16, DataType::float32, c, 0.5, 4, s);
  });
  add("unpack fp32->fp32 x0.5, 1 tensor", 2 * B, [&] {
    kolo::cuda::unpack(&one_unpack, 1, DataType::float32, DataType::float32, c, 0.5, 1, s);
  });
  add("reduce fp32 sum", 3 * B,
      [&] { kolo::cuda::reduce(b, a, n, DataType::float32, ReduceOp::sum, s); });
  add("reduce fp16 sum (same bytes)", 3 * B,
      [&] { kolo::cuda::reduce(b, a, 2 * n, DataType::float16, ReduceOp::sum, s); });
  add("reduce bf16 sum (same bytes)", 3 * B,
      [&] { kolo::cuda::reduce(b, a, 2 * n, DataType::bfloat16, ReduceOp::sum, s); });
  for (bool aligned : {false, true}) {
    const std::string suffix = aligned ? ", 16 B offsets" : "";
    const auto pi = make_items(random1000, a, 4, 2, true, aligned);
    add("pack fp32->fp16 x0.5, 1000 random tensors" + suffix, 6 * N, [&] {
      kolo::cuda::pack(pi.data(), pi.size(), DataType::float32, DataType::float16, c, 0.5, s);
    });
    const auto ui = make_items(random1000, b, 4, 2, false, aligned);
    add("unpack fp16->fp32 x0.5/4, 1000 random tensors" + suffix, 6 * N, [&] {
      kolo::cuda::unpack(ui.data(), ui.size(), DataType::float16, DataType::float32, c, 0.5, 4, s);
    });
  }
  {  // latency: small batches, where launch and upload dominate
    const FusionItem tiny{a, nullptr, 1024, 0};
    add("pack fp32->fp32, 1 tensor of 4 KiB (latency)", 2 * 4096.0,
        [&] { kolo::cuda::pack(&tiny, 1, DataType::float32, DataType::float32, c, 1.0, s); });
    const auto items = make_items(std::vector<std::size_t>(1000, 256), a, 4, 2, true, false);
    add("pack fp32->fp16, 1000 tensors of 1 KiB (latency)", 6 * 256000.0, [&] {
      kolo::cuda::pack(items.data(), items.size(), DataType::float32, DataType::float16, c, 0.5, s);
    });
  }
  ok(cudaStreamSynchronize(s), "cudaStreamSynchronize");

  const double d2d = rows.front().bytes / rows.front().us / 1e3;  // GB/s
  std::printf("GPU: %s (%d SMs), %zu MiB, median of %d runs\n\n", prop.name,
              prop.multiProcessorCount, mib, reps);
  std::printf(
      "| kernel | MiB moved | us per call | GB/s | of D2D copy | us, one call alone | host us "
      "per call |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const double gbps = r.bytes / r.us / 1e3;
    std::printf("| %s | %.2f | %.1f | %.0f | %.0f%% | %.1f | %.1f |\n", r.name.c_str(),
                r.bytes / (1 << 20), r.us, gbps, 100.0 * gbps / d2d, r.alone_us, r.host_us);
  }
  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\n  \"gpu\": \"" << prop.name << "\",\n  \"mib\": " << mib << ",\n  \"reps\": " << reps
      << ",\n  \"d2d_gbps\": " << d2d << ",\n  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      const double gbps = r.bytes / r.us / 1e3;
      f << "    {\"name\": \"" << r.name << "\", \"bytes\": " << static_cast<std::uint64_t>(r.bytes)
        << ", \"median_us\": " << r.us << ", \"alone_us\": " << r.alone_us
        << ", \"host_us\": " << r.host_us << ", \"gbps\": " << gbps
        << ", \"fraction_of_d2d\": " << gbps / d2d << "}" << (i + 1 < rows.size() ? "," : "")
        << "\n";
    }
    f << "  ]\n}\n";
    if (!f) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 1;
    }
  }
  (void)cudaFree(a);
  (void)cudaFree(b);
  (void)cudaFree(c);
  (void)cudaStreamDestroy(s);
  return 0;
}
