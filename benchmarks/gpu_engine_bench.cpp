// gpu_engine_bench.cpp — what kolo adds on top of raw NCCL, on device buffers (under kolo-run;
// one GPU per rank).
//
//   kolo-run -np 1 kolo-gpu-engine-bench [--mib 64] [--tensors 1000] [--reps 30] [--json PATH]
//
// Rows (median wall time of --reps after warm-up; every row ends with the stream synchronised):
//   raw ncclAllReduce            on the transport's own communicator and stream
//   Communicator::allreduce      the blocking kolo call (pointer checks, watchdog wait)
//   Engine, 1 tensor             allreduce_async + wait: negotiation, the progress thread
//   Engine, T tensors fused      T tensors of (MiB / T) each: one pack launch, one NCCL call,
//                                one unpack launch
//   Engine, T fused, fp16 wire   the same with Fp16Compressor (pack+compress, unpack+decompress)
// and each row's ratio to the raw NCCL call of the same total size.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>
#include <kolo/transport/nccl.hpp>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
using Comm = kolo::Communicator<kolo::NcclTransport>;

void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

template <class F>
double median_ms(int reps, F&& f) {
  for (int i = 0; i < 5; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(Clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The same decision on every rank (rank 0's timing), so that ranks run the same number of
// collectives.
struct Row {
  std::string name;
  double ms;
};

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = 64;
  std::size_t tensors = 1000;
  int reps = 30;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) {
      mib = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--tensors" && i + 1 < argc) {
      tensors = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: kolo-gpu-engine-bench [--mib N] [--tensors T] [--reps R] [--json P]\n");
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device on this machine\n");
    return 77;
  }
  if (std::getenv("KOLO_SIZE") == nullptr) {  // a plain run is a 1-rank job
    ::setenv("KOLO_SIZE", "1", 1);
    ::setenv("KOLO_RANK", "0", 1);
  }
  const std::size_t count = mib * (1u << 20) / 4;
  Comm comm = Comm::from_env();
  auto& t = comm.transport();
  const int dev = t.device();
  const kolo::Device d = kolo::Device::cuda(dev);
  cudaDeviceProp prop{};
  ok(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  // Out of place: on one rank an in-place ncclAllReduce has nothing to do (2 us), while out of
  // place it copies the tensor — the smallest real work NCCL does, so the harshest baseline.
  void* buf = nullptr;
  void* out = nullptr;
  ok(cudaMalloc(&buf, count * 4), "cudaMalloc");
  ok(cudaMalloc(&out, count * 4), "cudaMalloc");
  ok(cudaMemset(buf, 0, count * 4), "cudaMemset");
  std::vector<Row> rows;
  auto raw_call = [&](void* dst) {
    if (ncclAllReduce(buf, dst, count, ncclFloat32, ncclSum, t.nccl_comm(), t.stream()) !=
        ncclSuccess) {
      std::fprintf(stderr, "ncclAllReduce failed\n");
      std::exit(1);
    }
    ok(cudaStreamSynchronize(t.stream()), "cudaStreamSynchronize");
  };
  const double raw = median_ms(reps, [&] { raw_call(out); });
  rows.push_back({"raw ncclAllReduce (out of place)", raw});
  rows.push_back({"raw ncclAllReduce (in place)", median_ms(reps, [&] { raw_call(buf); })});
  const kolo::TensorView vin(buf, count, kolo::DataType::float32, d);
  const kolo::TensorView vout(out, count, kolo::DataType::float32, d);
  rows.push_back({"Communicator::allreduce (out of place)",
                  median_ms(reps, [&] { comm.allreduce(vin, vout); })});
  rows.push_back(
      {"Communicator::allreduce (in place)", median_ms(reps, [&] { comm.allreduce(vin); })});

  const int rank = comm.rank();
  const int size = comm.size();
  std::vector<void*> parts(tensors);
  const std::size_t per = count / tensors;
  for (auto& p : parts) ok(cudaMalloc(&p, per * 4), "cudaMalloc");
  for (int compress = 0; compress < 2; ++compress) {
    kolo::EngineOptions opts = kolo::EngineOptions::from_env();
    opts.compression =
        compress ? kolo::CompressionPolicy::of<kolo::Fp16Compressor>() : kolo::CompressionPolicy{};
    kolo::Engine<kolo::NcclTransport> eng(Comm::from_env(), opts);
    if (!compress) {
      rows.push_back({"Engine, 1 tensor (out of place)", median_ms(reps, [&] {
                        eng.allreduce_async("one", vin, kolo::ReduceOp::sum, 1.0, 1.0, vout).wait();
                      })});
      rows.push_back({"Engine, 1 tensor (in place)",
                      median_ms(reps, [&] { eng.allreduce_async("one", vin).wait(); })});
    }
    std::vector<kolo::Handle> hs(tensors);
    const std::string label =
        "Engine, " + std::to_string(tensors) + " tensors fused" + (compress ? ", fp16 wire" : "");
    rows.push_back({label, median_ms(reps, [&] {
                      for (std::size_t i = 0; i < tensors; ++i) {
                        hs[i] = eng.allreduce_async(
                            "p" + std::to_string(i),
                            kolo::TensorView(parts[i], per, kolo::DataType::float32, d));
                      }
                      for (auto& h : hs) h.wait();
                    })});
  }
  if (rank == 0) {
    std::printf(
        "# kolo-gpu-engine-bench: %s, %d rank(s), float32 sum, %zu MiB total, %zu "
        "tensors of %zu KiB for the fused rows, median of %d\n",
        prop.name, size, mib, tensors, per * 4 / 1024, reps);
    std::printf(
        "| path | time (ms) | vs raw NCCL out of place | added (us) |\n"
        "| --- | ---: | ---: | ---: |\n");
    for (const auto& r : rows) {
      std::printf("| %s | %.3f | %.3f | %+.1f |\n", r.name.c_str(), r.ms, r.ms / raw,
                  (r.ms - raw) * 1000.0);
    }
    if (!json.empty()) {
      std::ofstream f(json);
      f << "{\"gpu\": \"" << prop.name << "\", \"ranks\": " << size << ", \"mib\": " << mib
        << ", \"tensors\": " << tensors << ", \"rows\": [";
      for (std::size_t i = 0; i < rows.size(); ++i) {
        f << (i ? ", " : "") << "{\"path\": \"" << rows[i].name << "\", \"ms\": " << rows[i].ms
          << ", \"vs_raw\": " << rows[i].ms / raw << "}";
      }
      f << "]}\n";
    }
  }
  for (auto& p : parts) (void)cudaFree(p);
  (void)cudaFree(buf);
  (void)cudaFree(out);
  return 0;
}
