// test_kernels.cu — the device fusion kernels (kolo/cuda/kernels.cuh) against the host
// implementation they must reproduce: kolo::reduce, detail::scaled_copy (the host FusionBuffer)
// and the Fp16/Bf16 compressors. Every comparison is exact, bit for bit, with one documented
// exception: a NaN produced by arithmetic or a conversion only has to be a NaN (the device writes
// the canonical NaN, the host keeps the payload). Plain copies (same type, scale 1, divisor 1)
// are compared bitwise even for NaNs.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kolo/compression/compressor.hpp"
#include "kolo/core/dtype.hpp"
#include "kolo/core/error.hpp"
#include "kolo/core/float16.hpp"
#include "kolo/core/reduce.hpp"
#include "kolo/cuda/kernels.cuh"
#include "kolo/engine/fusion_buffer.hpp"

namespace {

using kolo::DataType;
using kolo::ReduceOp;
using kolo::cuda::FusionItem;
using Bytes = std::vector<std::byte>;

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    const std::string m =
        std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    FAIL(m);
  }
}

class DeviceMemory {
 public:
  explicit DeviceMemory(std::size_t bytes) : bytes_(bytes) {
    cuda_ok(cudaMalloc(&p_, bytes > 0 ? bytes : 1), "cudaMalloc");
  }
  ~DeviceMemory() { (void)cudaFree(p_); }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  std::byte* get() const { return static_cast<std::byte*>(p_); }
  void upload(const Bytes& h, std::size_t at = 0) {
    REQUIRE(at + h.size() <= bytes_);
    if (h.empty()) return;
    cuda_ok(cudaMemcpy(get() + at, h.data(), h.size(), cudaMemcpyHostToDevice), "upload");
    // From pageable memory cudaMemcpy may return before its last DMA has landed, and the
    // tests' streams do not synchronise with the legacy stream: wait for it.
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize (upload)");
  }
  Bytes download(std::size_t at = 0, std::size_t bytes = SIZE_MAX) const {
    if (bytes == SIZE_MAX) bytes = bytes_ - at;
    Bytes h(bytes);
    if (bytes > 0)
      cuda_ok(cudaMemcpy(h.data(), get() + at, bytes, cudaMemcpyDeviceToHost), "download");
    return h;
  }

 private:
  void* p_ = nullptr;
  std::size_t bytes_;
};

class Stream {
 public:
  Stream() { cuda_ok(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~Stream() { (void)cudaStreamDestroy(s_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return s_; }
  void sync() const { cuda_ok(cudaStreamSynchronize(s_), "cudaStreamSynchronize"); }

 private:
  cudaStream_t s_ = nullptr;
};

// ---- element values ----

template <class T>
void put(Bytes& b, std::size_t i, T v) {
  std::memcpy(b.data() + i * sizeof(T), &v, sizeof(T));
}
template <class T>
T get(const std::byte* p, std::size_t i = 0) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

// ±m * 2^e with m uniform in [1, 2): ldexp into the subnormals rounds, as wanted.
float random_float(std::mt19937_64& rng, int emin, int emax) {
  std::uniform_real_distribution<float> m(1.0f, 2.0f);
  std::uniform_int_distribution<int> e(emin, emax);
  const float v = std::ldexp(m(rng), e(rng));
  return (rng() & 1) ? -v : v;
}
double random_double(std::mt19937_64& rng, int emin, int emax) {
  std::uniform_real_distribution<double> m(1.0, 2.0);
  std::uniform_int_distribution<int> e(emin, emax);
  const double v = std::ldexp(m(rng), e(rng));
  return (rng() & 1) ? -v : v;
}

bool half_is_nan(std::uint16_t b) {
  return (b & 0x7c00u) == 0x7c00u && (b & 0x3ffu) != 0;
}
bool bf16_is_nan(std::uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0;
}

constexpr std::uint16_t kHalfSpecials[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x0001,
                                           0x8001, 0x03ff, 0x0400, 0x7bff, 0xfbff,
                                           0x3c00, 0x3555, 0x7e00, 0x7c01, 0xfe5a};
constexpr std::uint16_t kBf16Specials[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x0001,
                                           0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f,
                                           0x3f80, 0x3eab, 0x7fc0, 0x7f81, 0xffa5};

// Random elements of type t: a mix of random bit patterns (every exponent), values of moderate
// size (so that sums and products round), and special values (zeros, infinities, subnormals,
// the largest finite values and, if `nans`, NaNs with payloads).
Bytes random_elements(DataType t, std::size_t n, std::mt19937_64& rng, bool nans) {
  Bytes b(n * kolo::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned pick = static_cast<unsigned>(rng() % 100);
    switch (t) {
      case DataType::float16: {
        std::uint16_t v;
        if (pick < 4) {
          v = kHalfSpecials[rng() % std::size(kHalfSpecials)];
        } else if (pick < 40) {
          v = static_cast<std::uint16_t>(rng());
        } else {
          v = kolo::float16(random_float(rng, -26, 16)).bits;
        }
        if (!nans && half_is_nan(v)) v = 0x3c00;
        put(b, i, v);
        break;
      }
      case DataType::bfloat16: {
        std::uint16_t v;
        if (pick < 4) {
          v = kBf16Specials[rng() % std::size(kBf16Specials)];
        } else if (pick < 40) {
          v = static_cast<std::uint16_t>(rng());
        } else {
          v = kolo::bfloat16(random_float(rng, -20, 20)).bits;
        }
        if (!nans && bf16_is_nan(v)) v = 0x3f80;
        put(b, i, v);
        break;
      }
      case DataType::float32: {
        float v;
        if (pick < 4) {
          constexpr std::uint32_t sp[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u,
                                          0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x7fc00000u,
                                          0x7fa12345u, 0xffc0beefu};
          v = std::bit_cast<float>(sp[rng() % std::size(sp)]);
        } else if (pick < 30) {
          v = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
        } else {
          v = random_float(rng, -12, 12);
        }
        if (!nans && std::isnan(v)) v = 1.0f;
        put(b, i, v);
        break;
      }
      case DataType::float64: {
        double v;
        if (pick < 4) {
          constexpr std::uint64_t sp[] = {
              0x0ull, 0x8000000000000000ull, 0x7ff0000000000000ull, 0xfff0000000000000ull,
              0x1ull, 0x7fefffffffffffffull, 0x7ff8000000000000ull, 0x7ff4000000000123ull};
          v = std::bit_cast<double>(sp[rng() % std::size(sp)]);
        } else if (pick < 30) {
          v = std::bit_cast<double>(static_cast<std::uint64_t>(rng()));
        } else {
          v = random_double(rng, -30, 30);
        }
        if (!nans && std::isnan(v)) v = 1.0;
        put(b, i, v);
        break;
      }
      case DataType::int8:
      case DataType::uint8:
        put(b, i, static_cast<std::uint8_t>(rng()));
        break;
      case DataType::int32:
        put(b, i, static_cast<std::uint32_t>(rng()));
        break;
      case DataType::int64:
        put(b, i, static_cast<std::uint64_t>(rng()));
        break;
    }
  }
  return b;
}

// float32 inputs aimed at the float16/bfloat16 roundings: values across float16's range
// (subnormals, overflow), exact ties of both formats, random bit patterns and special values.
Bytes compression_inputs(std::size_t n, std::mt19937_64& rng) {
  Bytes b(n * 4);
  constexpr std::uint32_t sp[] = {
      0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
      0x7f800001u, 0x477fe000u,  // 65504: the largest float16
      0x477ff000u,               // 65520: ties to Inf
      0x477fefffu,               // just below the tie: 65504
      0x33000000u,               // 2^-25: ties to 0
      0x33000001u,               // just above: the smallest subnormal
      0x33c00000u,               // 1.5 * 2^-24: ties to even (2 * 2^-24)
      0x38800000u,               // 2^-14: the smallest normal float16
      0x387fffffu, 0x00000001u, 0x807fffffu, 0x7f7fffffu, 0x7f7f8000u, 0x7f7f7fffu,
      0x3f808000u,  // 1 + 2^-8: a bfloat16 tie (to even: 1)
      0x3f818000u,  // a bfloat16 tie (to even: up)
  };
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned pick = static_cast<unsigned>(rng() % 100);
    std::uint32_t x;
    if (pick < 5) {
      x = sp[rng() % std::size(sp)];
    } else if (pick < 20) {
      x = static_cast<std::uint32_t>(rng());
    } else if (pick < 35) {  // float16 ties: a finite half plus half an ulp (13 dropped bits)
      std::uint16_t h = static_cast<std::uint16_t>(rng());
      if ((h & 0x7c00u) == 0x7c00u) h &= 0xbfffu;
      x = std::bit_cast<std::uint32_t>(kolo::detail::half_bits_to_float(h));
      if ((h & 0x7c00u) != 0) x += 0x1000u;  // normal halves: the tie bit of the 13 dropped
    } else if (pick < 45) {                  // bfloat16 ties
      x = (static_cast<std::uint32_t>(rng()) & 0x7f7f0000u) | 0x8000u;
    } else {
      x = std::bit_cast<std::uint32_t>(random_float(rng, -27, 16));
    }
    put(b, i, std::bit_cast<float>(x));
  }
  return b;
}

bool element_is_nan(DataType t, const std::byte* p) {
  switch (t) {
    case DataType::float16:
      return half_is_nan(get<std::uint16_t>(p));
    case DataType::bfloat16:
      return bf16_is_nan(get<std::uint16_t>(p));
    case DataType::float32:
      return std::isnan(get<float>(p));
    case DataType::float64:
      return std::isnan(get<double>(p));
    default:
      return false;
  }
}

std::string element_hex(DataType t, const std::byte* p) {
  std::ostringstream o;
  o << "0x" << std::hex;
  for (std::size_t k = kolo::dtype_size(t); k-- > 0;) {
    o << ((static_cast<unsigned>(p[k]) >> 4) & 0xf) << (static_cast<unsigned>(p[k]) & 0xf);
  }
  return o.str();
}

// Element for element, bit for bit; with nan_equivalent, any two NaNs are equal.
void check_same(DataType t, const Bytes& got, const Bytes& want, bool nan_equivalent,
                const std::string& what) {
  REQUIRE(got.size() == want.size());
  const std::size_t es = kolo::dtype_size(t);
  const std::size_t n = got.size() / es;
  std::size_t bad = 0, first = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::byte* g = got.data() + i * es;
    const std::byte* w = want.data() + i * es;
    if (std::memcmp(g, w, es) == 0) continue;
    if (nan_equivalent && element_is_nan(t, g) && element_is_nan(t, w)) continue;
    if (bad++ == 0) first = i;
  }
  if (bad != 0) {
    FAIL_CHECK(what << ": " << bad << " of " << n << " " << std::string(kolo::dtype_name(t))
                    << " elements differ; first at " << first << ": device "
                    << element_hex(t, got.data() + first * es) << ", host "
                    << element_hex(t, want.data() + first * es));
  } else {
    CHECK(bad == 0);
  }
}

// ---- batches ----

// The geometry of a batch: tensor sizes (odd, some empty), where each tensor lies in its arena
// (random gaps, so every alignment occurs), where it lies in the fusion buffer (shuffled order,
// random gaps), and which tensors are null (pack: zeros; unpack: skipped).
struct Layout {
  std::vector<std::size_t> count, pos, off;
  std::vector<bool> null;
  std::size_t arena = 0, buf = 0;
};

Layout make_layout(std::size_t items, std::mt19937_64& rng, std::size_t fixed_count = 0) {
  Layout L;
  L.count.resize(items);
  L.pos.resize(items);
  L.off.resize(items);
  L.null.assign(items, false);
  for (std::size_t i = 0; i < items; ++i) {
    const unsigned r = static_cast<unsigned>(rng() % 100);
    if (fixed_count != 0) {
      L.count[i] = fixed_count;
    } else if (r < 4) {
      L.count[i] = 0;
    } else if (r < 70) {
      L.count[i] = 1 + rng() % 64;
    } else if (r < 95) {
      L.count[i] = 65 + rng() % 5000;
    } else {
      L.count[i] = 5001 + rng() % 70000;
    }
    if (items >= 7 && rng() % 20 == 0) L.null[i] = true;
  }
  if (items >= 7) L.null[items / 2] = true;
  std::size_t p = 0;
  for (std::size_t i = 0; i < items; ++i) {
    p += rng() % 8;
    L.pos[i] = p;
    p += L.count[i];
  }
  L.arena = p + 8;
  std::vector<std::size_t> order(items);
  for (std::size_t i = 0; i < items; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::size_t q = 0;
  for (std::size_t k : order) {
    q += rng() % 4;
    L.off[k] = q;
    q += L.count[k];
  }
  L.buf = q + 8;
  return L;
}

constexpr std::byte kSentinel{0xa5};

// One pack: random tensors, the host's expected buffer, the device run and the comparison.
struct PackCase {
  DataType in, wire;
  double scale;
  Layout L;
  Bytes src, buf0, want;
  std::unique_ptr<DeviceMemory> dsrc, dbuf;
  std::vector<FusionItem> items;

  PackCase(DataType in_, DataType wire_, double scale_, Layout layout, std::mt19937_64& rng)
      : in(in_), wire(wire_), scale(scale_), L(std::move(layout)) {
    const std::size_t is = kolo::dtype_size(in), ws = kolo::dtype_size(wire);
    src = in == wire ? random_elements(in, L.arena, rng, true) : compression_inputs(L.arena, rng);
    buf0.assign(L.buf * ws, kSentinel);
    dsrc = std::make_unique<DeviceMemory>(src.size());
    dbuf = std::make_unique<DeviceMemory>(buf0.size());
    dsrc->upload(src);
    dbuf->upload(buf0);
    want = buf0;
    for (std::size_t i = 0; i < L.count.size(); ++i) {
      const std::size_t n = L.count[i];
      items.push_back({L.null[i] ? nullptr : dsrc->get() + L.pos[i] * is, nullptr, n, L.off[i]});
      const Bytes zeros(n * is + 8, std::byte{0});
      const std::byte* hs = L.null[i] ? zeros.data() : src.data() + L.pos[i] * is;
      std::byte* hd = want.data() + L.off[i] * ws;
      if (in == wire) {
        kolo::detail::scaled_copy(hd, hs, n, in, scale);
      } else if (wire == DataType::float16) {
        kolo::Fp16Compressor::compress(reinterpret_cast<const float*>(hs), hd, n,
                                       static_cast<float>(scale));
      } else {
        kolo::Bf16Compressor::compress(reinterpret_cast<const float*>(hs), hd, n,
                                       static_cast<float>(scale));
      }
    }
  }
  bool bitwise() const { return in == wire && (scale == 1.0 || !kolo::dtype_is_floating(in)); }
  void run(cudaStream_t s) {
    std::vector<FusionItem> copy = items;  // the launcher must read it before returning
    kolo::cuda::pack(copy.data(), copy.size(), in, wire, dbuf->get(), scale, s);
    std::fill(copy.begin(), copy.end(), FusionItem{nullptr, nullptr, 12345, 999999});
  }
  void check(const std::string& what) const {
    check_same(wire, dbuf->download(), want, !bitwise(), what);
  }
};

struct UnpackCase {
  DataType wire, out;
  double scale;
  int divisor;
  Layout L;
  Bytes buf, dst0, want;
  std::unique_ptr<DeviceMemory> dbuf, ddst;
  std::vector<FusionItem> items;

  UnpackCase(DataType wire_, DataType out_, double scale_, int divisor_, Layout layout,
             std::mt19937_64& rng)
      : wire(wire_), out(out_), scale(scale_), divisor(divisor_), L(std::move(layout)) {
    const std::size_t ws = kolo::dtype_size(wire), os = kolo::dtype_size(out);
    buf = random_elements(wire, L.buf, rng, true);
    dst0.assign(L.arena * os, kSentinel);
    dbuf = std::make_unique<DeviceMemory>(buf.size());
    ddst = std::make_unique<DeviceMemory>(dst0.size());
    dbuf->upload(buf);
    ddst->upload(dst0);
    want = dst0;
    for (std::size_t i = 0; i < L.count.size(); ++i) {
      const std::size_t n = L.count[i];
      items.push_back({nullptr, L.null[i] ? nullptr : ddst->get() + L.pos[i] * os, n, L.off[i]});
      if (L.null[i]) continue;  // skipped: the sentinel stays
      const std::byte* hs = buf.data() + L.off[i] * ws;
      std::byte* hd = want.data() + L.pos[i] * os;
      if (wire == out) {
        kolo::detail::scaled_copy(hd, hs, n, out, scale, divisor);
      } else if (wire == DataType::float16) {
        kolo::Fp16Compressor::decompress(hs, reinterpret_cast<float*>(hd), n,
                                         static_cast<float>(scale / divisor));
      } else {
        kolo::Bf16Compressor::decompress(hs, reinterpret_cast<float*>(hd), n,
                                         static_cast<float>(scale / divisor));
      }
    }
  }
  bool bitwise() const {
    return !kolo::dtype_is_floating(out) || (wire == out && scale == 1.0 && divisor == 1);
  }
  void run(cudaStream_t s) {
    std::vector<FusionItem> copy = items;
    kolo::cuda::unpack(copy.data(), copy.size(), wire, out, dbuf->get(), scale, divisor, s);
    std::fill(copy.begin(), copy.end(), FusionItem{nullptr, nullptr, 12345, 999999});
  }
  void check(const std::string& what) const {
    check_same(out, ddst->download(), want, !bitwise(), what);
  }
};

// Batches: one large tensor (vector path, a 64-bit-sized grid), one small one, and many.
struct BatchShape {
  std::size_t items;
  std::size_t fixed_count;  // 0: random sizes
};
// Up to 120 tensors travel in the kernel's parameters, more are uploaded: both sides of that.
constexpr BatchShape kShapes[] = {{1, 1048579}, {1, 0},   {7, 0},   {120, 0},
                                  {121, 0},     {100, 0}, {1000, 0}};

std::string describe(const char* op, DataType a, DataType b, double scale, int divisor,
                     const BatchShape& shape) {
  std::ostringstream o;
  o << op << " " << kolo::dtype_name(a) << "->" << kolo::dtype_name(b) << " scale " << scale
    << " divisor " << divisor << ", " << shape.items << " tensor(s)"
    << (shape.fixed_count ? " of " + std::to_string(shape.fixed_count) : std::string());
  return o.str();
}

// Captures what `enqueue` puts on the stream as a CUDA graph (ending the capture on a throw).
template <class F>
cudaGraph_t capture(Stream& s, F&& enqueue) {
  cudaGraph_t graph = nullptr;
  cuda_ok(cudaStreamBeginCapture(s.get(), cudaStreamCaptureModeGlobal), "cudaStreamBeginCapture");
  try {
    enqueue();
  } catch (...) {
    cudaGraph_t broken = nullptr;
    (void)cudaStreamEndCapture(s.get(), &broken);
    if (broken) (void)cudaGraphDestroy(broken);
    throw;
  }
  cuda_ok(cudaStreamEndCapture(s.get(), &graph), "cudaStreamEndCapture");
  REQUIRE(graph != nullptr);
  return graph;
}

// The types of a graph's nodes.
std::vector<cudaGraphNodeType> node_types(cudaGraph_t graph) {
  std::size_t count = 0;
  cuda_ok(cudaGraphGetNodes(graph, nullptr, &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNode_t> nodes(count);
  cuda_ok(cudaGraphGetNodes(graph, nodes.data(), &count), "cudaGraphGetNodes");
  std::vector<cudaGraphNodeType> types(count);
  for (std::size_t i = 0; i < count; ++i) {
    cuda_ok(cudaGraphNodeGetType(nodes[i], &types[i]), "cudaGraphNodeGetType");
  }
  return types;
}

}  // namespace

// First, so that it is the first use of its kernel in the process: capture works from a cold
// start (lazy module loading, the first descriptor upload).
TEST_CASE("one launch per batch: a captured pack of 1000 tensors is one kernel node") {
  std::mt19937_64 rng(7);
  Stream s;
  PackCase pc(DataType::float32, DataType::bfloat16, 0.375, make_layout(1000, rng), rng);

  cudaGraph_t graph = capture(s, [&] { pc.run(s.get()); });
  int kernels = 0, memcpys = 0, others = 0;
  for (cudaGraphNodeType type : node_types(graph)) {
    if (type == cudaGraphNodeTypeKernel)
      ++kernels;
    else if (type == cudaGraphNodeTypeMemcpy)
      ++memcpys;
    else
      ++others;  // the descriptors' alloc and free nodes
  }
  INFO("graph nodes: " << kernels << " kernel, " << memcpys << " memcpy, " << others << " other");
  CHECK(kernels == 1);
  CHECK(memcpys <= 1);

  // The graph replays correctly, also after the launcher's host memory is long gone and other
  // batches ran in between.
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  PackCase other(DataType::float32, DataType::bfloat16, 2.0, make_layout(100, rng), rng);
  other.run(s.get());
  for (int replay = 0; replay < 2; ++replay) {
    pc.dbuf->upload(pc.buf0);
    cuda_ok(cudaGraphLaunch(exec, s.get()), "cudaGraphLaunch");
    s.sync();
    pc.check("graph replay " + std::to_string(replay));
  }
  other.check("the batch between capture and replay");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST_CASE("a captured batch of up to 120 tensors is a single kernel node (no upload)") {
  std::mt19937_64 rng(17);
  Stream s;
  UnpackCase uc(DataType::float16, DataType::float32, 0.5, 3, make_layout(120, rng), rng);
  cudaGraph_t graph = capture(s, [&] { uc.run(s.get()); });
  const std::vector<cudaGraphNodeType> types = node_types(graph);
  REQUIRE(types.size() == 1);
  CHECK(types[0] == cudaGraphNodeTypeKernel);
  cudaGraphExec_t exec = nullptr;
  cuda_ok(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  cuda_ok(cudaGraphLaunch(exec, s.get()), "cudaGraphLaunch");
  s.sync();
  uc.check("captured unpack of 120 tensors");
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
}

TEST_CASE("including kernels.cuh registers the kernel table") {
  const kolo::cuda::FusionKernels* k = kolo::cuda::registered_kernels();
  REQUIRE(k != nullptr);
  CHECK(k == &kolo::cuda::kernel_detail::kernel_table);
  REQUIRE((k->pack != nullptr && k->unpack != nullptr && k->reduce != nullptr));

  std::mt19937_64 rng(11);
  Stream s;
  PackCase pc(DataType::float32, DataType::float16, 0.5, make_layout(7, rng), rng);
  k->pack(pc.items.data(), pc.items.size(), pc.in, pc.wire, pc.dbuf->get(), pc.scale, s.get());
  UnpackCase uc(DataType::float16, DataType::float32, 2.0, 3, make_layout(7, rng), rng);
  k->unpack(uc.items.data(), uc.items.size(), uc.wire, uc.out, uc.dbuf->get(), uc.scale, uc.divisor,
            s.get());
  const std::size_t n = 1001;
  Bytes a = random_elements(DataType::int32, n, rng, false);
  Bytes b = random_elements(DataType::int32, n, rng, false);
  DeviceMemory da(a.size()), db(b.size());
  da.upload(a);
  db.upload(b);
  k->reduce(da.get(), db.get(), n, DataType::int32, ReduceOp::sum, s.get());
  s.sync();
  pc.check("pack through the table");
  uc.check("unpack through the table");
  kolo::reduce(a.data(), a.data(), b.data(), n, DataType::int32, ReduceOp::sum);
  check_same(DataType::int32, da.download(), a, false, "reduce through the table");
}

TEST_CASE("reduce: every dtype and op, bit for bit with kolo::reduce") {
  std::mt19937_64 rng(1);
  Stream s;
  constexpr std::size_t sizes[] = {0, 1, 7, 1000, 1048579};
  constexpr std::size_t max_n = 1048579 + 1;  // + the largest offset below
  // Element offsets of dst and src: the same phase (vector path after a scalar head) and
  // different phases (scalar path).
  constexpr std::size_t offsets[][2] = {{0, 0}, {1, 1}, {0, 1}, {3, 2}};
  for (DataType t : kolo::all_dtypes) {
    const std::size_t es = kolo::dtype_size(t);
    const Bytes a = random_elements(t, max_n + 3, rng, true);
    const Bytes b = random_elements(t, max_n + 3, rng, true);
    DeviceMemory da(a.size()), db(b.size());
    for (ReduceOp op : kolo::all_reduce_ops) {
      for (std::size_t n : sizes) {
        for (const auto& o : offsets) {
          const std::size_t od = o[0], os = o[1];
          Bytes ha(a.begin() + static_cast<std::ptrdiff_t>(od * es),
                   a.begin() + static_cast<std::ptrdiff_t>((od + n) * es));
          Bytes hb(b.begin() + static_cast<std::ptrdiff_t>(os * es),
                   b.begin() + static_cast<std::ptrdiff_t>((os + n) * es));
          da.upload(ha, od * es);
          db.upload(hb, os * es);
          kolo::cuda::reduce(da.get() + od * es, db.get() + os * es, n, t, op, s.get());
          kolo::reduce(ha.data(), ha.data(), hb.data(), n, t, op);
          s.sync();
          std::ostringstream what;
          what << "reduce " << kolo::dtype_name(t) << " " << kolo::reduce_op_name(op) << " n=" << n
               << " dst+" << od << " src+" << os;
          check_same(t, da.download(od * es, n * es), ha, true, what.str());
        }
      }
    }
  }
}

TEST_CASE("reduce: special values, every pair") {
  Stream s;
  for (DataType t : {DataType::float16, DataType::bfloat16, DataType::float32, DataType::float64}) {
    std::vector<double> vals = {0.0,
                                -0.0,
                                1.0,
                                -1.5,
                                std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity(),
                                std::numeric_limits<double>::quiet_NaN(),
                                65504.0,
                                -65504.0,
                                6e-8,
                                3e38,
                                -3.3e38,
                                1e-40,
                                1e308,
                                5e-324};
    const std::size_t k = vals.size(), n = k * k, es = kolo::dtype_size(t);
    Bytes a(n * es), b(n * es);
    for (std::size_t i = 0; i < k; ++i) {
      for (std::size_t j = 0; j < k; ++j) {
        const std::size_t e = i * k + j;
        const double x = vals[i], y = vals[j];
        switch (t) {
          case DataType::float16:
            put(a, e, kolo::float16(static_cast<float>(x)).bits);
            put(b, e, kolo::float16(static_cast<float>(y)).bits);
            break;
          case DataType::bfloat16:
            put(a, e, kolo::bfloat16(static_cast<float>(x)).bits);
            put(b, e, kolo::bfloat16(static_cast<float>(y)).bits);
            break;
          case DataType::float32:
            put(a, e, static_cast<float>(x));
            put(b, e, static_cast<float>(y));
            break;
          default:
            put(a, e, x);
            put(b, e, y);
            break;
        }
      }
    }
    DeviceMemory da(a.size()), db(b.size());
    for (ReduceOp op : kolo::all_reduce_ops) {
      da.upload(a);
      db.upload(b);
      kolo::cuda::reduce(da.get(), db.get(), n, t, op, s.get());
      Bytes want = a;
      kolo::reduce(want.data(), want.data(), b.data(), n, t, op);
      s.sync();
      check_same(t, da.download(), want, true,
                 std::string("special values ") + std::string(kolo::dtype_name(t)) + " " +
                     std::string(kolo::reduce_op_name(op)));
    }
  }
}

TEST_CASE("pack: every dtype; scale 1 is a bitwise copy, floating types also scale") {
  std::mt19937_64 rng(2);
  Stream s;
  for (DataType t : kolo::all_dtypes) {
    std::vector<double> scales = {1.0};
    if (kolo::dtype_is_floating(t)) scales.insert(scales.end(), {0.5, 3.0, -1.0 / 3.0});
    for (double scale : scales) {
      for (const BatchShape& shape : kShapes) {
        PackCase pc(t, t, scale, make_layout(shape.items, rng, shape.fixed_count), rng);
        pc.run(s.get());
        s.sync();
        pc.check(describe("pack", t, t, scale, 1, shape));
      }
    }
  }
}

TEST_CASE("unpack: every dtype; divisor 1 and 3; floating types also scale") {
  std::mt19937_64 rng(3);
  Stream s;
  for (DataType t : kolo::all_dtypes) {
    std::vector<std::pair<double, int>> cases = {{1.0, 1}, {1.0, 3}};
    if (kolo::dtype_is_floating(t)) {
      cases.insert(cases.end(), {{0.5, 1}, {3.0, 1}, {0.5, 3}, {3.0, 3}, {-2.0, 7}});
    } else {
      cases.push_back({1.0, -7});
    }
    for (const auto& [scale, divisor] : cases) {
      for (const BatchShape& shape : kShapes) {
        UnpackCase uc(t, t, scale, divisor, make_layout(shape.items, rng, shape.fixed_count), rng);
        uc.run(s.get());
        s.sync();
        uc.check(describe("unpack", t, t, scale, divisor, shape));
      }
    }
  }
}

TEST_CASE("pack with compression: float32 to float16/bfloat16, as the host compressors") {
  std::mt19937_64 rng(4);
  Stream s;
  for (DataType wire : {DataType::float16, DataType::bfloat16}) {
    for (double scale : {1.0, 0.5, 3.0, 1.0 / 3.0, 1024.0}) {
      for (const BatchShape& shape : kShapes) {
        PackCase pc(DataType::float32, wire, scale,
                    make_layout(shape.items, rng, shape.fixed_count), rng);
        pc.run(s.get());
        s.sync();
        pc.check(describe("pack", DataType::float32, wire, scale, 1, shape));
      }
    }
  }
}

TEST_CASE("unpack with decompression: float16/bfloat16 to float32, as the host compressors") {
  std::mt19937_64 rng(5);
  Stream s;
  for (DataType wire : {DataType::float16, DataType::bfloat16}) {
    for (const auto& [scale, divisor] :
         std::vector<std::pair<double, int>>{{1.0, 1}, {0.5, 1}, {3.0, 1}, {1.0, 3}, {0.5, 3}}) {
      for (const BatchShape& shape : kShapes) {
        UnpackCase uc(wire, DataType::float32, scale, divisor,
                      make_layout(shape.items, rng, shape.fixed_count), rng);
        uc.run(s.get());
        s.sync();
        uc.check(describe("unpack", wire, DataType::float32, scale, divisor, shape));
      }
    }
  }
}

TEST_CASE("compression sweep: 2^24 float32 bit patterns across the whole range") {
  Stream s;
  std::mt19937_64 rng(6);
  const std::size_t n = std::size_t{1} << 24;
  Bytes src(n * 4);
  for (std::size_t i = 0; i < n; ++i) {  // the top 24 bits in order, the low 8 at random
    put(src, i, static_cast<std::uint32_t>((i << 8) | (rng() & 0xffu)));
  }
  DeviceMemory dsrc(src.size()), dbuf(n * 2);
  dsrc.upload(src);
  const FusionItem item{dsrc.get(), nullptr, n, 0};
  for (DataType wire : {DataType::float16, DataType::bfloat16}) {
    for (double scale : {1.0, 0.1}) {
      kolo::cuda::pack(&item, 1, DataType::float32, wire, dbuf.get(), scale, s.get());
      Bytes want(n * 2);
      const auto* f = reinterpret_cast<const float*>(src.data());
      if (wire == DataType::float16) {
        kolo::Fp16Compressor::compress(f, want.data(), n, static_cast<float>(scale));
      } else {
        kolo::Bf16Compressor::compress(f, want.data(), n, static_cast<float>(scale));
      }
      s.sync();
      check_same(wire, dbuf.download(), want, true,
                 std::string("sweep ") + std::string(kolo::dtype_name(wire)) + " scale " +
                     std::to_string(scale));
    }
  }
}

TEST_CASE("decompression: all 65536 16-bit patterns") {
  Stream s;
  const std::size_t n = 65536;
  Bytes wire_bits(n * 2);
  for (std::size_t i = 0; i < n; ++i) put(wire_bits, i, static_cast<std::uint16_t>(i));
  DeviceMemory dbuf(wire_bits.size()), ddst(n * 4);
  dbuf.upload(wire_bits);
  FusionItem item{nullptr, ddst.get(), n, 0};
  for (DataType wire : {DataType::float16, DataType::bfloat16}) {
    for (const auto& [scale, divisor] : std::vector<std::pair<double, int>>{{1.0, 1}, {3.0, 7}}) {
      kolo::cuda::unpack(&item, 1, wire, DataType::float32, dbuf.get(), scale, divisor, s.get());
      Bytes want(n * 4);
      auto* f = reinterpret_cast<float*>(want.data());
      const float k = static_cast<float>(scale / divisor);
      if (wire == DataType::float16) {
        kolo::Fp16Compressor::decompress(wire_bits.data(), f, n, k);
      } else {
        kolo::Bf16Compressor::decompress(wire_bits.data(), f, n, k);
      }
      s.sync();
      check_same(DataType::float32, ddst.download(), want, true,
                 std::string("all patterns ") + std::string(kolo::dtype_name(wire)) + " scale " +
                     std::to_string(scale) + "/" + std::to_string(divisor));
    }
  }
}

TEST_CASE("conversions: every float16 and bfloat16 value converts back to itself") {
  // unpack(16-bit -> float32) then pack(float32 -> 16-bit): the identity on every non-NaN pattern.
  Stream s;
  const std::size_t n = 65536;
  Bytes bits(n * 2);
  for (std::size_t i = 0; i < n; ++i) put(bits, i, static_cast<std::uint16_t>(i));
  DeviceMemory d16(bits.size()), d32(n * 4), back(n * 2);
  d16.upload(bits);
  for (DataType wire : {DataType::float16, DataType::bfloat16}) {
    const FusionItem out{nullptr, d32.get(), n, 0};
    kolo::cuda::unpack(&out, 1, wire, DataType::float32, d16.get(), 1.0, 1, s.get());
    const FusionItem in{d32.get(), nullptr, n, 0};
    kolo::cuda::pack(&in, 1, DataType::float32, wire, back.get(), 1.0, s.get());
    s.sync();
    check_same(wire, back.download(), bits, true,
               std::string("round trip ") + std::string(kolo::dtype_name(wire)));
  }
}

TEST_CASE("batches on two streams, and on four host threads at once") {
  std::mt19937_64 rng(8);
  Stream s1, s2;
  std::vector<std::unique_ptr<PackCase>> packs;
  std::vector<std::unique_ptr<UnpackCase>> unpacks;
  for (int i = 0; i < 6; ++i) {
    packs.push_back(std::make_unique<PackCase>(DataType::float32, DataType::float16, 0.25,
                                               make_layout(i % 2 ? 1000 : 7, rng), rng));
    unpacks.push_back(std::make_unique<UnpackCase>(DataType::bfloat16, DataType::float32, 1.0, 3,
                                                   make_layout(i % 2 ? 7 : 1000, rng), rng));
  }
  for (int i = 0; i < 6; ++i) {  // no synchronisation between the streams
    packs[static_cast<std::size_t>(i)]->run(i % 2 ? s1.get() : s2.get());
    unpacks[static_cast<std::size_t>(i)]->run(i % 2 ? s2.get() : s1.get());
  }
  s1.sync();
  s2.sync();
  for (int i = 0; i < 6; ++i) {
    packs[static_cast<std::size_t>(i)]->check("two streams: pack " + std::to_string(i));
    unpacks[static_cast<std::size_t>(i)]->check("two streams: unpack " + std::to_string(i));
  }

  // Threads: each its own stream and cases; results checked here (one thread asserts).
  constexpr int kThreads = 4, kRounds = 10;
  std::vector<std::unique_ptr<PackCase>> tp;
  for (int t = 0; t < kThreads; ++t) {
    tp.push_back(std::make_unique<PackCase>(DataType::float64, DataType::float64, 0.5,
                                            make_layout(t % 2 ? 300 : 60, rng), rng));
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      cudaStream_t st = nullptr;
      if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) != cudaSuccess) {
        ++failures;
        return;
      }
      try {
        for (int r = 0; r < kRounds; ++r) tp[static_cast<std::size_t>(t)]->run(st);
        if (cudaStreamSynchronize(st) != cudaSuccess) ++failures;
      } catch (...) {
        ++failures;
      }
      (void)cudaStreamDestroy(st);
    });
  }
  for (auto& th : threads) th.join();
  CHECK(failures.load() == 0);
  for (int t = 0; t < kThreads; ++t) {
    tp[static_cast<std::size_t>(t)]->check("thread " + std::to_string(t));
  }
}

TEST_CASE("descriptor scratch fallback (devices without memory pools): streams and growth") {
  struct Restore {
    ~Restore() { kolo::cuda::kernel_detail::force_scratch_fallback() = false; }
  } restore;
  kolo::cuda::kernel_detail::force_scratch_fallback() = true;
  std::mt19937_64 rng(9);
  Stream s1, s2;
  std::vector<std::unique_ptr<PackCase>> packs;
  for (std::size_t items : {7, 1000, 100, 1000, 1}) {
    packs.push_back(std::make_unique<PackCase>(DataType::float32, DataType::float32, 3.0,
                                               make_layout(items, rng), rng));
  }
  UnpackCase uc(DataType::int32, DataType::int32, 1.0, 3, make_layout(1000, rng), rng);
  for (std::size_t i = 0; i < packs.size(); ++i) packs[i]->run(i % 2 ? s1.get() : s2.get());
  uc.run(s1.get());
  s1.sync();
  s2.sync();
  for (std::size_t i = 0; i < packs.size(); ++i) packs[i]->check("fallback " + std::to_string(i));
  uc.check("fallback unpack");
}

namespace {
// Keeps a stream busy for `ns` nanoseconds (work queued behind it waits).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
}  // namespace

TEST_CASE("uploaded descriptors stay intact while their upload waits in the stream") {
  // Uploads queue behind a busy kernel (their pool memory and the launcher's host copies are
  // long reused by then); every batch must still see its own descriptors.
  std::mt19937_64 rng(10);
  Stream s;
  std::vector<std::unique_ptr<PackCase>> packs;
  std::vector<std::unique_ptr<UnpackCase>> unpacks;
  for (std::size_t i = 0; i < 12; ++i) {
    packs.push_back(std::make_unique<PackCase>(DataType::float32, DataType::float16, 0.5,
                                               make_layout(121 + 97 * i, rng), rng));
    unpacks.push_back(std::make_unique<UnpackCase>(DataType::bfloat16, DataType::float32, 2.0, 3,
                                                   make_layout(1000 - 50 * i, rng), rng));
  }
  spin_kernel<<<1, 1, 0, s.get()>>>(50'000'000ull);
  cuda_ok(cudaGetLastError(), "spin_kernel");
  for (std::size_t i = 0; i < packs.size(); ++i) {
    packs[i]->run(s.get());
    unpacks[i]->run(s.get());
  }
  s.sync();
  for (std::size_t i = 0; i < packs.size(); ++i) {
    packs[i]->check("queued pack " + std::to_string(i));
    unpacks[i]->check("queued unpack " + std::to_string(i));
  }
}

TEST_CASE("empty batches and zero counts launch nothing and succeed") {
  Stream s;
  std::vector<FusionItem> none(5, FusionItem{nullptr, nullptr, 0, 0});
  kolo::cuda::pack(nullptr, 0, DataType::float32, DataType::float16, nullptr, 2.0, s.get());
  kolo::cuda::pack(none.data(), none.size(), DataType::int8, DataType::int8, nullptr, 1.0, s.get());
  kolo::cuda::unpack(none.data(), none.size(), DataType::float16, DataType::float32, nullptr, 1.0,
                     4, s.get());
  kolo::cuda::reduce(nullptr, nullptr, 0, DataType::float64, ReduceOp::product, s.get());
  // Unpack items without a destination are skipped even when they have elements.
  std::vector<FusionItem> skipped(3, FusionItem{nullptr, nullptr, 100, 0});
  kolo::cuda::unpack(skipped.data(), skipped.size(), DataType::float32, DataType::float32, nullptr,
                     1.0, 1, s.get());
  s.sync();
}

TEST_CASE("bad combinations are ConfigErrors that name them") {
  Stream s;
  DeviceMemory d(1024);
  const FusionItem item{d.get(), d.get(), 4, 0};
  const auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const kolo::ConfigError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("wrong exception type: ") + e.what();
    }
    return "no exception";
  };
  std::string m = message([&] {
    kolo::cuda::pack(&item, 1, DataType::float64, DataType::float16, d.get(), 1.0, s.get());
  });
  CHECK_MESSAGE(m.find("float64") != std::string::npos, m);
  CHECK_MESSAGE(m.find("float16") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::pack(&item, 1, DataType::float32, DataType::int8, d.get(), 1.0, s.get());
  });
  CHECK_MESSAGE(m.find("int8") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::unpack(&item, 1, DataType::float32, DataType::bfloat16, d.get(), 1.0, 1, s.get());
  });
  CHECK_MESSAGE(m.find("bfloat16") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::unpack(&item, 1, DataType::float16, DataType::float64, d.get(), 1.0, 1, s.get());
  });
  CHECK_MESSAGE(m.find("float64") != std::string::npos, m);
  m = message(
      [&] { kolo::cuda::pack(&item, 1, DataType::int32, DataType::int32, d.get(), 2.0, s.get()); });
  CHECK_MESSAGE(m.find("int32") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::unpack(&item, 1, DataType::int64, DataType::int64, d.get(), 0.5, 2, s.get());
  });
  CHECK_MESSAGE(m.find("int64") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::unpack(&item, 1, DataType::uint8, DataType::uint8, d.get(), 1.0, 0, s.get());
  });
  CHECK_MESSAGE(m.find("divisor") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::reduce(d.get(), d.get(), 4, DataType::float32, static_cast<ReduceOp>(42), s.get());
  });
  CHECK_MESSAGE(m.find("42") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::reduce(d.get(), d.get(), 4, static_cast<DataType>(99), ReduceOp::sum, s.get());
  });
  CHECK_MESSAGE(m.find("99") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::pack(&item, 1, DataType::float32, DataType::float32, nullptr, 1.0, s.get());
  });
  CHECK_MESSAGE(m.find("null") != std::string::npos, m);
  m = message([&] {
    kolo::cuda::pack(nullptr, 3, DataType::float32, DataType::float32, d.get(), 1.0, s.get());
  });
  CHECK_MESSAGE(m.find("null") != std::string::npos, m);
  s.sync();
}

TEST_CASE("CUDA errors become kolo::Error with the CUDA error and what was being done") {
  try {
    kolo::cuda::kernel_detail::check(cudaErrorInvalidValue, "kolo::cuda::pack",
                                     "cudaMemcpyAsync (descriptor upload)");
    FAIL("no exception");
  } catch (const kolo::ConfigError&) {
    FAIL("a CUDA error is not a configuration error");
  } catch (const kolo::Error& e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("cudaErrorInvalidValue") != std::string::npos, m);
    CHECK_MESSAGE(m.find("descriptor upload") != std::string::npos, m);
    CHECK_MESSAGE(m.find("kolo::cuda::pack") != std::string::npos, m);
  }
}

TEST_CASE("counts beyond 2^31 elements") {
  std::size_t free_bytes = 0, total = 0;
  cuda_ok(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
  const std::size_t n = (std::size_t{1} << 31) + 77;
  if (free_bytes < 2 * n + (std::size_t{1} << 30)) {
    MESSAGE("skipped: needs " << (2 * n >> 20) << " MiB of free device memory");
    return;
  }
  Stream s;
  Bytes h(n);
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  for (std::size_t i = 0; i < n; ++i) {  // xorshift: every byte depends on its index
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h[i] = static_cast<std::byte>(x >> 56);
  }
  DeviceMemory dsrc(n), dbuf(n + 2048);
  dsrc.upload(h);
  // One tensor of n elements (vector path), and one of 1000 read one byte off (scalar path),
  // placed after it in the buffer.
  const FusionItem items[2] = {{dsrc.get(), nullptr, n, 0}, {dsrc.get() + 1, nullptr, 1000, n + 3}};
  kolo::cuda::pack(items, 2, DataType::int8, DataType::int8, dbuf.get(), 1.0, s.get());
  s.sync();
  {
    const Bytes got = dbuf.download(0, n);
    CHECK(std::memcmp(got.data(), h.data(), n) == 0);
    const Bytes tail = dbuf.download(n + 3, 1000);
    CHECK(std::memcmp(tail.data(), h.data() + 1, 1000) == 0);
  }
  // reduce: dsrc += dbuf (the same values: 2x, wrapping).
  kolo::cuda::reduce(dsrc.get(), dbuf.get(), n, DataType::int8, ReduceOp::sum, s.get());
  s.sync();
  const Bytes got = dsrc.download();
  kolo::reduce(h.data(), h.data(), h.data(), n, DataType::int8, ReduceOp::sum);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += got[i] != h[i];
  CHECK(bad == 0);
}
