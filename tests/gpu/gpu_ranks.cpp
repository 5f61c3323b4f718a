// gpu_ranks.cpp — one rank of a GPU test job under kolo-run (device buffers, real NCCL).
//
//   gpu_ranks collectives [hosts]   every collective on device buffers through
//                                   Communicator<NcclTransport> (KOLO_NCCL=0: host-staged), the
//                                   engine on device tensors (fused, scaled, compressed, joined
//                                   ranks' zeros), host buffers through the same communicator;
//                                   "hosts" gives each rank its own host key (the hierarchical
//                                   NCCL-inside / TCP-across variant on one machine)
//   gpu_ranks expect-error TEXT     building the communicator and running one allreduce must
//                                   throw a kolo::Error whose message contains TEXT
//   gpu_ranks peer-exit [hosts]     the last rank leaves after setup; the others' device
//                                   collectives end in a PeerLostError naming it
//   gpu_ranks no-device             on a machine without a GPU: a ConfigError naming it, on
//                                   every rank (exit 77, skipped, where a GPU exists)
// Exit 77 (CTest's skip) with a message when a mode needs a GPU and there is none: the reasons
// no-gpu and gpu-present of tests/common/skip.hpp (KOLO_TEST_REQUIRE_GPU=1 fails the first).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>
#include <kolo/transport/nccl.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "../common/skip.hpp"

namespace {

using kolo::DataType;
using kolo::ReduceOp;

int g_rank = 0;
int g_fail = 0;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "rank %d: %s: %s\n", g_rank, what, cudaGetErrorString(e));
    std::exit(1);
  }
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

// A device buffer that frees itself.
struct DevBuf {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit DevBuf(std::size_t b) : bytes(b) {
    cuda_ok(cudaMalloc(&p, b > 0 ? b : 1), "cudaMalloc");
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() { (void)cudaFree(p); }
  void put(const std::vector<std::byte>& h) {
    if (!h.empty()) cuda_ok(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice), "H2D");
  }
  std::vector<std::byte> get(std::size_t n) const {
    std::vector<std::byte> h(n);
    if (n > 0) cuda_ok(cudaMemcpy(h.data(), p, n, cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
};

// Small integers (exact in every dtype, products of up to 8 ranks fit int8): -2..2, or 0..2 for
// uint8.
double value(int rank, std::size_t i, DataType t, int salt = 0) {
  if (t == DataType::uint8)
    return static_cast<double>((i + static_cast<std::size_t>(rank) + salt) % 3);
  return static_cast<double>(
      static_cast<long long>(
          (i * 7 + static_cast<std::size_t>(rank) * 3 + static_cast<std::size_t>(salt)) % 5) -
      2);
}

std::vector<std::byte> fill(int rank, std::size_t n, DataType t, int salt = 0) {
  std::vector<std::byte> out(n * kolo::dtype_size(t));
  kolo::visit_dtype(t, [&](auto tag) {
    using T = decltype(tag);
    T* p = reinterpret_cast<T*>(out.data());
    for (std::size_t i = 0; i < n; ++i) p[i] = T(static_cast<float>(value(rank, i, t, salt)));
  });
  return out;
}

double at(const std::vector<std::byte>& b, std::size_t i, DataType t) {
  return kolo::visit_dtype(t, [&](auto tag) -> double {
    using T = decltype(tag);
    return static_cast<double>(static_cast<float>(reinterpret_cast<const T*>(b.data())[i]));
  });
}

// The reference: the host's own reduction over every rank's input, in rank order.
std::vector<std::byte> reference(int size, std::size_t n, DataType t, ReduceOp op, int salt = 0) {
  std::vector<std::byte> acc = fill(0, n, t, salt);
  for (int r = 1; r < size; ++r) {
    const auto x = fill(r, n, t, salt);
    kolo::reduce(acc.data(), acc.data(), x.data(), n, t, op);
  }
  if (op == ReduceOp::average) kolo::finish_average(acc.data(), n, t, size);
  return acc;
}

// Exact, except averages of floating types (NCCL may scale before adding): 1e-2 relative for
// 16-bit floats, 1e-6 otherwise.
void expect_equal(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
                  std::size_t n, DataType t, ReduceOp op, const std::string& what) {
  const bool approx = op == ReduceOp::average && kolo::dtype_is_floating(t);
  const double tol = (t == DataType::float16 || t == DataType::bfloat16) ? 1e-2 : 1e-6;
  for (std::size_t i = 0; i < n; ++i) {
    const double g = at(got, i, t);
    const double w = at(want, i, t);
    const bool ok = approx ? std::fabs(g - w) <= tol * std::max(1.0, std::fabs(w)) : g == w;
    if (!ok) {
      std::fprintf(stderr, "rank %d: %s: element %zu is %.9g, expected %.9g\n", g_rank,
                   what.c_str(), i, g, w);
      ++g_fail;
      return;
    }
  }
}

kolo::Device dev(int d) {
  return kolo::Device::cuda(d);
}

template <class Comm>
void check_collectives(Comm& comm, int device) {
  const int n = comm.size();
  const int r = comm.rank();
  // allreduce: every dtype x op x count, out of place and in place.
  for (DataType t : kolo::all_dtypes) {
    for (ReduceOp op : kolo::all_reduce_ops) {
      for (std::size_t count : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000},
                                std::size_t{1048579}}) {
        if (count == 1048579 && op != ReduceOp::sum && op != ReduceOp::average) continue;
        const std::size_t bytes = count * kolo::dtype_size(t);
        DevBuf in(bytes), out(bytes);
        in.put(fill(r, count, t));
        comm.allreduce(kolo::TensorView(in.p, count, t, dev(device)),
                       kolo::TensorView(out.p, count, t, dev(device)), op);
        const std::string what = "allreduce " + std::string(kolo::dtype_name(t)) + " " +
                                 std::string(kolo::reduce_op_name(op)) + " x" +
                                 std::to_string(count);
        const auto want = reference(n, count, t, op);
        expect_equal(out.get(bytes), want, count, t, op, what);
        comm.allreduce(kolo::TensorView(in.p, count, t, dev(device)), op);  // in place
        expect_equal(in.get(bytes), want, count, t, op, what + " in place");
      }
    }
  }
  // Host buffers through the same communicator take the mesh.
  {
    auto h = fill(r, 1000, DataType::float32);
    comm.allreduce(kolo::TensorView(h.data(), 1000, DataType::float32));
    expect_equal(h, reference(n, 1000, DataType::float32, ReduceOp::sum), 1000, DataType::float32,
                 ReduceOp::sum, "host allreduce");
  }
  // allgather (equal) and allgatherv (uneven, one rank empty).
  {
    const std::size_t c = 1000;
    DevBuf in(c * 4), out(c * 4 * static_cast<std::size_t>(n));
    in.put(fill(r, c, DataType::int32, 1));
    comm.allgather(
        kolo::TensorView(in.p, c, DataType::int32, dev(device)),
        kolo::TensorView(out.p, c * static_cast<std::size_t>(n), DataType::int32, dev(device)));
    const auto got = out.get(out.bytes);
    for (int q = 0; q < n; ++q) {
      std::vector<std::byte> part(got.begin() + static_cast<long>(q * c * 4),
                                  got.begin() + static_cast<long>((q + 1) * c * 4));
      expect_equal(part, fill(q, c, DataType::int32, 1), c, DataType::int32, ReduceOp::sum,
                   "allgather from rank " + std::to_string(q));
    }
    std::vector<std::size_t> counts;
    for (int q = 0; q < n; ++q) counts.push_back(q == 1 ? 0 : static_cast<std::size_t>(3 * q + 5));
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    const std::size_t mine = counts[static_cast<std::size_t>(r)];
    DevBuf vin(mine * 8), vout(total * 8);
    vin.put(fill(r, mine, DataType::float64, 2));
    comm.allgatherv(kolo::TensorView(vin.p, mine, DataType::float64, dev(device)),
                    kolo::TensorView(vout.p, total, DataType::float64, dev(device)), counts);
    const auto vgot = vout.get(total * 8);
    std::size_t off = 0;
    for (int q = 0; q < n; ++q) {
      const std::size_t cq = counts[static_cast<std::size_t>(q)];
      std::vector<std::byte> part(vgot.begin() + static_cast<long>(off * 8),
                                  vgot.begin() + static_cast<long>((off + cq) * 8));
      expect_equal(part, fill(q, cq, DataType::float64, 2), cq, DataType::float64, ReduceOp::sum,
                   "allgatherv from rank " + std::to_string(q));
      off += cq;
    }
  }
  // broadcast from the last rank.
  {
    const std::size_t c = 1001;
    DevBuf b(c * 8);
    b.put(fill(r, c, DataType::float64, 3));
    comm.broadcast(kolo::TensorView(b.p, c, DataType::float64, dev(device)), n - 1);
    expect_equal(b.get(c * 8), fill(n - 1, c, DataType::float64, 3), c, DataType::float64,
                 ReduceOp::sum, "broadcast");
  }
  // reduce_scatter: rank r gets block r of the sum.
  {
    const std::size_t c = 999;
    const std::size_t all = c * static_cast<std::size_t>(n);
    DevBuf in(all * 4), out(c * 4);
    in.put(fill(r, all, DataType::float32, 4));
    comm.reduce_scatter(kolo::TensorView(in.p, all, DataType::float32, dev(device)),
                        kolo::TensorView(out.p, c, DataType::float32, dev(device)));
    const auto full = reference(n, all, DataType::float32, ReduceOp::sum, 4);
    std::vector<std::byte> block(full.begin() + static_cast<long>(r * c * 4),
                                 full.begin() + static_cast<long>((r + 1) * c * 4));
    expect_equal(out.get(c * 4), block, c, DataType::float32, ReduceOp::sum, "reduce_scatter");
  }
  // alltoall: block q of rank r's input lands as block r of rank q's output.
  {
    const std::size_t blk = 7;
    const std::size_t all = blk * static_cast<std::size_t>(n);
    DevBuf in(all * 8), out(all * 8);
    std::vector<std::byte> h(all * 8);
    auto* p = reinterpret_cast<std::int64_t*>(h.data());
    for (std::size_t i = 0; i < all; ++i) p[i] = r * 100000 + static_cast<std::int64_t>(i);
    in.put(h);
    comm.alltoall(kolo::TensorView(in.p, all, DataType::int64, dev(device)),
                  kolo::TensorView(out.p, all, DataType::int64, dev(device)));
    const auto got = out.get(all * 8);
    const auto* g = reinterpret_cast<const std::int64_t*>(got.data());
    for (int q = 0; q < n; ++q) {
      for (std::size_t i = 0; i < blk; ++i) {
        const std::int64_t want = q * 100000 + static_cast<std::int64_t>(r * blk + i);
        if (g[static_cast<std::size_t>(q) * blk + i] != want) {
          std::fprintf(stderr, "rank %d: alltoall block %d element %zu wrong\n", r, q, i);
          ++g_fail;
          q = n;
          break;
        }
      }
    }
  }
}

// The engine on device tensors: many named tensors of mixed dtypes and sizes, submitted in a
// different order on each rank, with scaling and averages; then a broadcast.
template <class T>
void check_engine(kolo::Communicator<T> comm, int device, bool compress) {
  kolo::EngineOptions opts = kolo::EngineOptions::from_env();
  if (compress) opts.compression = kolo::CompressionPolicy::of<kolo::Fp16Compressor>();
  kolo::Engine<T> eng(std::move(comm), opts);
  const int n = eng.size();
  const int r = eng.rank();
  struct Item {
    std::string name;
    DataType t;
    std::size_t count;
    ReduceOp op;
    double pre, post;
  };
  std::mt19937 gen(12345);  // the same tensors on every rank
  std::vector<Item> items;
  const int ntensors = compress ? 100 : 300;
  for (int i = 0; i < ntensors; ++i) {
    const DataType t = compress ? DataType::float32
                                : (i % 3 == 0   ? DataType::float16
                                   : i % 3 == 1 ? DataType::float32
                                                : DataType::int32);
    const std::size_t count = 1 + gen() % 5000;
    const bool fl = t != DataType::int32;
    const ReduceOp op = (i % 4 == 0 && fl) ? ReduceOp::average : ReduceOp::sum;
    const double pre = (fl && i % 5 == 0) ? 0.5 : 1.0;
    const double post = (fl && i % 7 == 0) ? 2.0 : 1.0;
    items.push_back({"t" + std::to_string(i), t, count, op, pre, post});
  }
  std::vector<std::unique_ptr<DevBuf>> bufs(items.size());
  std::vector<kolo::Handle> handles(items.size());
  std::vector<std::size_t> order(items.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::mt19937 shuffle(static_cast<unsigned>(1000 + r));
  std::shuffle(order.begin(), order.end(), shuffle);
  for (std::size_t k : order) {
    const Item& it = items[k];
    bufs[k] = std::make_unique<DevBuf>(it.count * kolo::dtype_size(it.t));
    bufs[k]->put(fill(r, it.count, it.t, static_cast<int>(k)));
    handles[k] = eng.allreduce_async(
        it.name, kolo::TensorView(bufs[k]->p, it.count, it.t, dev(device)), it.op, it.pre, it.post);
  }
  for (std::size_t k = 0; k < items.size(); ++k) {
    handles[k].wait();
    const Item& it = items[k];
    // Expected: post * op_r(pre * x_r); with these small values and factors every step is
    // exact except an average's division (tolerance) and fp16 compression (exact here: the
    // values are small multiples of 0.5).
    std::vector<std::byte> acc;
    for (int q = 0; q < n; ++q) {
      auto x = fill(q, it.count, it.t, static_cast<int>(k));
      kolo::detail::scaled_copy(x.data(), x.data(), it.count, it.t, it.pre);
      if (q == 0) {
        acc = x;
      } else {
        kolo::reduce(acc.data(), acc.data(), x.data(), it.count, it.t, ReduceOp::sum);
      }
    }
    kolo::detail::scaled_copy(acc.data(), acc.data(), it.count, it.t, it.post,
                              it.op == ReduceOp::average ? n : 1);
    expect_equal(bufs[k]->get(it.count * kolo::dtype_size(it.t)), acc, it.count, it.t,
                 it.op == ReduceOp::average ? ReduceOp::average : ReduceOp::sum,
                 "engine " + it.name + (compress ? " (fp16 wire)" : ""));
  }
  if (!compress) {
    // join(): rank q runs 2 + q steps of a single unscaled tensor (the engine's straight path)
    // and of a scaled pair (the fused path), then joins; joined ranks contribute zeros.
    const int my_steps = 2 + r;
    DevBuf j1(257 * 4), j2(100 * 4), j3(33 * 4);
    for (int step = 0; step < my_steps; ++step) {
      std::vector<float> v1(257, static_cast<float>(r + 1)), v2(100, static_cast<float>(r + 1)),
          v3(33, static_cast<float>(2 * r + 2));
      cuda_ok(cudaMemcpy(j1.p, v1.data(), 257 * 4, cudaMemcpyHostToDevice), "H2D");
      cuda_ok(cudaMemcpy(j2.p, v2.data(), 100 * 4, cudaMemcpyHostToDevice), "H2D");
      cuda_ok(cudaMemcpy(j3.p, v3.data(), 33 * 4, cudaMemcpyHostToDevice), "H2D");
      auto h1 = eng.allreduce_async("join.single",
                                    kolo::TensorView(j1.p, 257, DataType::float32, dev(device)));
      auto h2 =
          eng.allreduce_async("join.a", kolo::TensorView(j2.p, 100, DataType::float32, dev(device)),
                              ReduceOp::sum, 0.5, 1.0);
      auto h3 =
          eng.allreduce_async("join.b", kolo::TensorView(j3.p, 33, DataType::float32, dev(device)),
                              ReduceOp::sum, 0.5, 1.0);
      h1.wait();
      h2.wait();
      h3.wait();
      float want = 0;
      for (int q = 0; q < n; ++q) {
        if (2 + q > step) want += static_cast<float>(q + 1);
      }
      cuda_ok(cudaMemcpy(v1.data(), j1.p, 257 * 4, cudaMemcpyDeviceToHost), "D2H");
      cuda_ok(cudaMemcpy(v2.data(), j2.p, 100 * 4, cudaMemcpyDeviceToHost), "D2H");
      cuda_ok(cudaMemcpy(v3.data(), j3.p, 33 * 4, cudaMemcpyDeviceToHost), "D2H");
      if (v1[0] != want || v1[256] != want || v2[99] != want * 0.5f || v3[32] != want) {
        std::fprintf(stderr, "rank %d: join step %d: got %g %g %g %g, expected %g %g %g\n", r, step,
                     v1[0], v1[256], v2[99], v3[32], want, want * 0.5f, want);
        ++g_fail;
      }
    }
    eng.join();
    // A grouped allreduce and a broadcast of device tensors.
    DevBuf a(100 * 4), b(300 * 4), c(77 * 8);
    a.put(fill(r, 100, DataType::float32, 7));
    b.put(fill(r, 300, DataType::float32, 8));
    c.put(fill(r, 77, DataType::float64, 9));
    auto hs = eng.grouped_allreduce_async(
        "grp", {{"grp.a", kolo::TensorView(a.p, 100, DataType::float32, dev(device))},
                {"grp.b", kolo::TensorView(b.p, 300, DataType::float32, dev(device))}});
    auto hb =
        eng.broadcast_async("bc", kolo::TensorView(c.p, 77, DataType::float64, dev(device)), 0);
    for (auto& h : hs) h.wait();
    hb.wait();
    expect_equal(a.get(400), reference(n, 100, DataType::float32, ReduceOp::sum, 7), 100,
                 DataType::float32, ReduceOp::sum, "engine group member a");
    expect_equal(b.get(1200), reference(n, 300, DataType::float32, ReduceOp::sum, 8), 300,
                 DataType::float32, ReduceOp::sum, "engine group member b");
    expect_equal(c.get(77 * 8), fill(0, 77, DataType::float64, 9), 77, DataType::float64,
                 ReduceOp::sum, "engine broadcast");
  }
}

// Each rank its own "host": its own key, and the local/cross layout that goes with it (the
// hierarchical variant, NCCL inside each host and TCP across, on one machine).
void one_host_per_rank() {
  const std::string rk = std::getenv("KOLO_RANK") ? std::getenv("KOLO_RANK") : "0";
  const std::string sz = std::getenv("KOLO_SIZE") ? std::getenv("KOLO_SIZE") : "1";
  ::setenv("KOLO_HOST_KEY", ("gpu-test-host-" + rk).c_str(), 1);
  ::setenv("KOLO_LOCAL_RANK", "0", 1);
  ::setenv("KOLO_LOCAL_SIZE", "1", 1);
  ::setenv("KOLO_CROSS_RANK", rk.c_str(), 1);
  ::setenv("KOLO_CROSS_SIZE", sz.c_str(), 1);
}

int run_collectives(bool hosts) {
  if (hosts) {
    one_host_per_rank();
  }
  using Comm = kolo::Communicator<kolo::NcclTransport>;
  Comm comm = Comm::from_env();
  g_rank = comm.rank();
  const int device = comm.transport().device();
  const char* mode =
      !comm.transport().nccl_enabled()
          ? "host-staged (KOLO_NCCL=0)"
          : (comm.transport().hierarchical() ? "NCCL inside hosts, TCP across" : "NCCL");
  check_collectives(comm, device);
  check_engine(std::move(comm), device, false);
  check_engine(Comm::from_env(), device, true);
  if (g_fail != 0) {
    std::fprintf(stderr, "rank %d: %d check(s) FAILED (%s)\n", g_rank, g_fail, mode);
    return 1;
  }
  std::printf("rank %d: gpu collectives and engine OK on device %d (%s)\n", g_rank, device, mode);
  return 0;
}

int run_expect_error(const std::string& text) {
  try {
    auto comm = kolo::Communicator<kolo::NcclTransport>::from_env();
    g_rank = comm.rank();
    DevBuf b(4096);
    comm.allreduce(kolo::TensorView(b.p, 1024, DataType::float32, dev(comm.transport().device())));
  } catch (const kolo::Error& e) {
    const std::string what = e.what();
    std::printf("rank %s caught %s: %s\n", std::getenv("KOLO_RANK"),
                kolo::error_kind_name(e.kind()), what.c_str());
    return what.find(text) != std::string::npos ? 0 : 1;
  }
  std::printf("rank %s: no error, expected one containing '%s'\n", std::getenv("KOLO_RANK"),
              text.c_str());
  return 1;
}

// The last rank leaves right after setup (no collective, no goodbye); the others run device
// collectives and must get a PeerLostError naming it within the deadline.
int run_peer_exit(bool hosts) {
  if (hosts) {
    one_host_per_rank();
  }
  auto comm = kolo::Communicator<kolo::NcclTransport>::from_env();
  g_rank = comm.rank();
  const int leaver = comm.size() - 1;
  if (g_rank == leaver) {
    std::printf("rank %d: leaving without taking part\n", g_rank);
    std::fflush(stdout);
    std::_Exit(0);
  }
  DevBuf b(4 << 20);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100; ++i) {
      comm.allreduce(
          kolo::TensorView(b.p, 1 << 20, DataType::float32, dev(comm.transport().device())));
    }
  } catch (const kolo::PeerLostError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d caught PeerLostError after %.3f s: %s\n", g_rank, s, e.what());
    const std::string what = e.what();
    return what.find("rank " + std::to_string(leaver)) != std::string::npos ? 0 : 1;
  } catch (const kolo::Error& e) {
    std::printf("rank %d caught %s, expected PeerLostError: %s\n", g_rank,
                kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
  std::printf("rank %d: no error although rank %d left\n", g_rank, leaver);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "no-device") {
    if (device_count() > 0) {
      return kolo_test::skip_exit_code(
          "gpu-present", "this machine has a CUDA device; the no-device error is not reachable");
    }
    return run_expect_error("no CUDA device");
  }
  if (device_count() == 0) {
    return kolo_test::skip_exit_code("no-gpu", "no CUDA device on this machine");
  }
  if (mode == "collectives") return run_collectives(argc > 2 && std::string(argv[2]) == "hosts");
  if (mode == "expect-error" && argc > 2) return run_expect_error(argv[2]);
  if (mode == "peer-exit") return run_peer_exit(argc > 2 && std::string(argv[2]) == "hosts");
  std::fprintf(
      stderr,
      "usage: gpu_ranks collectives [hosts] | expect-error TEXT | peer-exit [hosts] | no-device\n");
  return 2;
}
