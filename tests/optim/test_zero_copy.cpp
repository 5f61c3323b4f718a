// Buffers from Communicator::allocate and the zero-copy allreduce that reads them in place
// (algorithm/allreduce_zero_copy.hpp), and the engine's fusion buffer in such memory.
//
// Under shared memory (optim/shm/np1..4) every rank's Buffer is mapped by the others and every
// allreduce below of at least zero_copy_bytes (0 here: all of them) takes the zero-copy path;
// under TCP (optim/tcp/np2) the same cases run through the channels, so the values checked are
// the same and only the path differs. Values are small integers in every dtype: every
// summation order is exact, so the checks are exact, and every rank must hold the same bits.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>

using kolo::ReduceOp;
using kolo::TensorView;

namespace {

kolo::Communicator<> zero_copy_comm() {
  auto co = kolo::CommunicatorOptions::from_env();
  co.zero_copy_bytes = 0;  // every size takes the path, down to one element
  return kolo::Communicator<>(kolo::Topology::from_env(), co);
}

// Rank r's element i, and the exact result over n ranks.
double value(ReduceOp op, int r, std::size_t i, int n) {
  if (op == ReduceOp::product)
    return 1.0 + static_cast<double>((i + static_cast<std::size_t>(r)) % 2);
  return static_cast<double>(n) * static_cast<double>(1 + i % 3) * (r + 1);
}
double expected(ReduceOp op, std::size_t i, int n) {
  double acc = value(op, 0, i, n);
  for (int r = 1; r < n; ++r) {
    const double x = value(op, r, i, n);
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::average:
        acc += x;
        break;
      case ReduceOp::min:
        acc = std::min(acc, x);
        break;
      case ReduceOp::max:
        acc = std::max(acc, x);
        break;
      case ReduceOp::product:
        acc *= x;
        break;
    }
  }
  return op == ReduceOp::average ? acc / n : acc;
}

}  // namespace

TEST_CASE("zero copy: every dtype x op x count, in place and out of place, exact and same bits") {
  auto comm = zero_copy_comm();
  const int n = comm.size(), me = comm.rank();
  const bool zc = comm.zero_copy_routes();
  // One rank, TCP: nothing to share. Shared memory with peers: shared.
  CHECK(zc == (n > 1 && std::string(std::getenv("KOLO_TRANSPORT") ? std::getenv("KOLO_TRANSPORT")
                                                                  : "") != "tcp"));
  const std::size_t counts[] = {1, 2, 3, 7, 64, 1000, 4097, 100003};
  for (kolo::DataType dt : kolo::all_dtypes) {
    kolo::visit_dtype(dt, [&](auto tag) {
      using E = decltype(tag);
      for (ReduceOp op : kolo::all_reduce_ops) {
        for (std::size_t count : counts) {
          const std::string dtype_name(kolo::dtype_name(dt));
          CAPTURE(dtype_name);
          CAPTURE(static_cast<int>(op));
          CAPTURE(count);
          auto in = comm.allocate<E>(count);
          auto out = comm.allocate<E>(count);
          CHECK(in.shared() == zc);
          for (bool in_place : {true, false}) {
            CAPTURE(in_place);
            for (std::size_t i = 0; i < count; ++i) {
              in[i] = static_cast<E>(static_cast<float>(value(op, me, i, n)));
              out[i] = static_cast<E>(-1.0f);
            }
            if (in_place) {
              comm.allreduce(in, op);
            } else {
              comm.allreduce(in, out, op);
            }
            CHECK(comm.last_allreduce_zero_copy() == zc);
            const kolo::Buffer<E>& res = in_place ? in : out;
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < count; ++i) {
              const double got = static_cast<double>(static_cast<float>(res[i]));
              if (got != expected(op, i, n) && wrong++ < 3) {
                FAIL_CHECK("[" << i << "] " << got << " != " << expected(op, i, n));
              }
            }
            CHECK(wrong == 0);
            if (!in_place) {  // the input is untouched
              for (std::size_t i = 0; i < count; i += 997) {
                CHECK(static_cast<float>(in[i]) == static_cast<float>(value(op, me, i, n)));
              }
            }
            std::vector<E> all(count * static_cast<std::size_t>(n));
            comm.allgather(TensorView(res.data(), count, dt), TensorView(std::span<E>(all)));
            for (int r = 0; r < n; ++r) {
              CHECK(std::memcmp(all.data() + static_cast<std::size_t>(r) * count, res.data(),
                                count * sizeof(E)) == 0);
            }
          }
        }
      }
    });
  }
}

TEST_CASE("zero copy: parts of Buffers, plain memory on some calls, and the size threshold") {
  auto co = kolo::CommunicatorOptions::from_env();
  co.zero_copy_bytes = 4096;
  kolo::Communicator<> comm(kolo::Topology::from_env(), co);
  const int n = comm.size(), me = comm.rank();
  const bool zc = comm.zero_copy_routes();
  auto buf = comm.allocate<std::int32_t>(10000);
  auto fill = [&](std::size_t count) {
    for (std::size_t i = 0; i < 10000; ++i) buf[i] = i < count ? me + 1 : -5;
  };
  // A prefix (the same offset 0 on every rank), above and below the threshold.
  for (std::size_t count : {std::size_t{1023}, std::size_t{1024}, std::size_t{9999}}) {
    CAPTURE(count);
    fill(count);
    comm.allreduce(buf.first(count), ReduceOp::sum);
    CHECK(comm.last_allreduce_zero_copy() == (zc && count * 4 >= 4096));
    CHECK(buf[0] == n * (n + 1) / 2);
    CHECK(buf[count - 1] == n * (n + 1) / 2);
    CHECK(buf[count] == -5);  // past the prefix: untouched
  }
  // A view in the middle of the Buffer through the TensorView overload.
  fill(10000);
  comm.allreduce(TensorView(buf.data() + 100, 5000, kolo::DataType::int32), ReduceOp::max);
  CHECK(comm.last_allreduce_zero_copy() == zc);
  CHECK(buf[99] == me + 1);
  CHECK(buf[100] == n);
  CHECK(buf[5099] == n);
  CHECK(buf[5100] == me + 1);
  // Plain memory beside it: the channels, the same result.
  std::vector<std::int32_t> plain(5000, me + 1);
  comm.allreduce(plain);
  CHECK(!comm.last_allreduce_zero_copy());
  CHECK(plain[4999] == n * (n + 1) / 2);
}

// What a BlockSink was handed: the ranges (first, count) in the order they came, and the values
// copied out during each call (the memory may be a peer's, valid only then).
struct Collected {
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  std::vector<std::int64_t> values;
  static void take(void* ctx, std::size_t first, std::size_t count, const std::byte* src) {
    auto& c = *static_cast<Collected*>(ctx);
    c.ranges.emplace_back(first, count);
    for (std::size_t i = 0; i < count; ++i) {
      std::int64_t v;
      std::memcpy(&v, src + i * sizeof(v), sizeof(v));
      c.values[first + i] = v;
    }
  }
};

TEST_CASE("zero copy: allreduce_to hands every element once, from the owners' blocks") {
  auto comm = zero_copy_comm();
  const int n = comm.size(), me = comm.rank();
  const bool zc = comm.zero_copy_routes();
  for (std::size_t count : {std::size_t{1}, std::size_t{2}, std::size_t{3}, std::size_t{5},
                            std::size_t{1000}, std::size_t{100003}}) {
    for (bool buffer : {true, false}) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::average}) {
        CAPTURE(count);
        CAPTURE(buffer);
        CAPTURE(static_cast<int>(op));
        auto b = comm.allocate<std::int64_t>(count);
        std::vector<std::int64_t> plain(count);
        std::int64_t* data = buffer ? b.data() : plain.data();
        // Rank r's element i: n * (i % 7 + 1) * (r + 1), so an average is exact.
        for (std::size_t i = 0; i < count; ++i) {
          data[i] = static_cast<std::int64_t>(n) * static_cast<std::int64_t>(i % 7 + 1) * (me + 1);
        }
        Collected c;
        c.values.assign(count, -1);
        comm.allreduce_to(TensorView(data, count, kolo::DataType::int64), op,
                          kolo::BlockSink{&c, &Collected::take});
        // The same with this rank's own block read through a BlockSource, in runs of at most 3
        // elements, from a copy; `data` holds garbage there.
        Collected c2;
        c2.values.assign(count, -1);
        if (op == ReduceOp::sum) {
          std::vector<std::int64_t> mine(count);
          for (std::size_t i = 0; i < count; ++i) {
            mine[i] =
                static_cast<std::int64_t>(n) * static_cast<std::int64_t>(i % 7 + 1) * (me + 1);
            data[i] = mine[i];
          }
          std::size_t first = 0, len = 0;
          kolo::zero_copy_block(count, me, n, first, len);
          for (std::size_t i = first; i < first + len; ++i) data[i] = 1000003;
          auto run_of = [](void* ctx, std::size_t at, std::size_t& cnt) -> const std::byte* {
            cnt = std::min<std::size_t>(cnt, 3 - at % 3);
            return reinterpret_cast<const std::byte*>(static_cast<std::int64_t*>(ctx) + at);
          };
          comm.allreduce_to(TensorView(data, count, kolo::DataType::int64), op,
                            kolo::BlockSink{&c2, &Collected::take},
                            kolo::BlockSource{mine.data(), run_of});
          CHECK(comm.last_allreduce_zero_copy() == (buffer && zc));
          CHECK(c2.values == c.values);
          CHECK(std::count(mine.begin(), mine.end(), 1000003) == 0);  // read, not written
        }
        const bool took = buffer && zc;
        CHECK(comm.last_allreduce_zero_copy() == took);
        // Disjoint ranges covering [0, count): one range unless the blocks came from their owners.
        std::vector<int> seen(count, 0);
        for (auto [first, len] : c.ranges) {
          REQUIRE(first + len <= count);
          for (std::size_t i = first; i < first + len; ++i) ++seen[i];
        }
        CHECK(std::count(seen.begin(), seen.end(), 1) == static_cast<long>(count));
        if (!took) CHECK(c.ranges.size() == 1);
        if (took)
          CHECK(c.ranges.size() == std::min<std::size_t>(count, static_cast<std::size_t>(n)));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const std::int64_t k =
              static_cast<std::int64_t>(n) * static_cast<std::int64_t>(i % 7 + 1);
          const std::int64_t want = op == ReduceOp::sum   ? k * n * (n + 1) / 2
                                    : op == ReduceOp::max ? k * n
                                                          : k * (n + 1) / 2;
          if (c.values[i] != want && wrong++ < 3) {
            FAIL_CHECK("[" << i << "] " << c.values[i] << " != " << want);
          }
        }
        CHECK(wrong == 0);
      }
    }
  }
}

TEST_CASE("zero copy: errors name the Buffer's problem") {
  // Too small: a prefix longer than the Buffer (a local error, before any collective), and an
  // output smaller than the input (ends the communicator on every rank, like any argument
  // error; a rank still in the barrier gets it there).
  {
    auto comm = zero_copy_comm();
    auto in = comm.allocate<float>(10);
    auto out = comm.allocate<float>(5);
    CHECK_THROWS_WITH_AS(in.first(11), doctest::Contains("Buffer::first(11): the Buffer holds 10"),
                         kolo::ConfigError);
    auto bad_call = [&] {
      comm.barrier();
      comm.allreduce(in, out);
    };
    CHECK_THROWS_WITH_AS(bad_call(),
                         doctest::Contains("the Buffer holds 5 elements, the collective needs 10"),
                         kolo::Error);
  }
  // A Buffer whose communicator has ended: its memory is still the user's, a collective on it
  // with another communicator is refused.
  kolo::Buffer<float> orphan;
  {
    auto comm = zero_copy_comm();
    orphan = comm.allocate<float>(1000);
    orphan[999] = 3.0f;
    CHECK(orphan.valid());
  }
  CHECK(!orphan.valid());
  CHECK(!orphan.shared());
  CHECK(orphan[999] == 3.0f);
  {
    auto comm = zero_copy_comm();
    auto bad_call = [&] {
      comm.barrier();
      comm.allreduce(orphan);
    };
    CHECK_THROWS_WITH_AS(
        bad_call(), doctest::Contains("allocated by a communicator that has ended"), kolo::Error);
  }
  // Different counts on different ranks: the same error on every rank.
  {
    auto comm = zero_copy_comm();
    if (comm.size() > 1) {
      CHECK_THROWS_WITH_AS(comm.allocate<float>(100 + static_cast<std::size_t>(comm.rank())),
                           doctest::Contains("the ranks asked for different sizes"),
                           kolo::ConfigError);
    }
    kolo::Buffer<float> empty;
    auto bad_call = [&] {
      comm.barrier();
      comm.allreduce(empty);
    };
    CHECK_THROWS_WITH_AS(bad_call(), doctest::Contains("holds no memory"), kolo::Error);
  }
}

// Unscaled batches go in pieces (the ring over the tensors themselves, faster than the shared
// fusion buffer's pack, in-place reads and unpack); scaled ones through the shared fusion
// buffer, the zero-copy path where the routes allow it.
TEST_CASE("zero copy: the engine's fused batches, in pieces and through the shared fusion buffer") {
  auto comm = zero_copy_comm();
  const bool zc = comm.zero_copy_routes();
  // A Buffer allocated before the communicator moves into the engine stays its (allocate is a
  // collective of its own: not to be called while the engine runs cycles on the communicator).
  auto b = comm.allocate<float>(70000);
  auto eo = kolo::EngineOptions::from_env();
  eo.compression = kolo::CompressionPolicy{};  // float32 equality (tcp/np2 sets fp16)
  kolo::Engine<> engine(std::move(comm), eo);
  const int n = engine.size(), me = engine.rank();
  // Sizes that do not line up with the ranks' blocks: tensors straddle the block boundaries, and
  // the unpack from the owners' blocks (Communicator::allreduce_to) must split them right.
  const std::size_t tensors = 16;
  auto count_of = [](std::size_t t) { return 1 + (t * 977 + 13) % 3001; };
  std::vector<std::vector<float>> in(tensors), out(tensors);
  // Three steps, and more (up to 20) until one is fused: on a loaded host the engine thread may
  // take a step's first submissions in cycles of their own (it wakes at the first). Negotiation is
  // replicated, so every rank counts the same fused batches and runs the same steps.
  for (int step = 0; step < 3 || (step < 20 && engine.stats().fused_collectives == 0); ++step) {
    std::vector<kolo::Handle> hs;
    for (std::size_t t = 0; t < tensors; ++t) {
      in[t].assign(count_of(t), static_cast<float>((me + 1) * (t + 1) + step));
      out[t].assign(count_of(t), -1.0f);
      hs.push_back(engine.allreduce_async("g" + std::to_string(t),
                                          TensorView(std::span<float>(in[t])), ReduceOp::average,
                                          1.0, 1.0, TensorView(std::span<float>(out[t]))));
    }
    for (auto& h : hs) h.wait();
    for (std::size_t t = 0; t < tensors; ++t) {
      const float want = static_cast<float>((n + 1) * (t + 1)) / 2.0f + static_cast<float>(step);
      CHECK(std::count(out[t].begin(), out[t].end(), want) == static_cast<long>(count_of(t)));
    }
  }
  if (n > 1) CHECK(engine.stats().piece_collectives >= 1);
  CHECK(engine.stats().zero_copy_collectives == 0);
  // Scaled batches: a postscale (the unpack multiplies) and a prescale (every block is packed,
  // the own block too, since the tensors hold unscaled values). Sums of small integers times
  // powers of two: exact.
  for (auto [pre, post] : {std::pair{1.0, 0.25}, std::pair{2.0, 1.0}, std::pair{4.0, 0.5}}) {
    CAPTURE(pre);
    CAPTURE(post);
    for (int step = 0; step < 2; ++step) {
      std::vector<kolo::Handle> hs;
      for (std::size_t t = 0; t < tensors; ++t) {
        in[t].assign(count_of(t), static_cast<float>((me + 1) * (t + 1)));
        out[t].assign(count_of(t), -1.0f);
        hs.push_back(engine.allreduce_async("s" + std::to_string(t),
                                            TensorView(std::span<float>(in[t])), ReduceOp::sum, pre,
                                            post, TensorView(std::span<float>(out[t]))));
      }
      for (auto& h : hs) h.wait();
      for (std::size_t t = 0; t < tensors; ++t) {
        const float want = static_cast<float>(pre * post * (n * (n + 1) / 2) * (t + 1));
        CHECK(std::count(out[t].begin(), out[t].end(), want) == static_cast<long>(count_of(t)));
        // The inputs are read, never written.
        CHECK(std::count(in[t].begin(), in[t].end(), static_cast<float>((me + 1) * (t + 1))) ==
              static_cast<long>(count_of(t)));
      }
    }
  }
  const auto st = engine.stats();
  CHECK(st.fused_collectives >= 1);
  if (zc) {
    CHECK(st.zero_copy_collectives >= 1);
  } else {
    CHECK(st.zero_copy_collectives == 0);
  }
  // A tensor in a Buffer of the engine's communicator: read in place on its own.
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(me + 1);
  const auto before = engine.stats().zero_copy_collectives;
  engine
      .allreduce_async("buffer", TensorView(b.data(), b.size(), kolo::DataType::float32),
                       ReduceOp::sum)
      .wait();
  CHECK(b[0] == static_cast<float>(n * (n + 1) / 2));
  CHECK(b[69999] == static_cast<float>(n * (n + 1) / 2));
  CHECK(engine.stats().zero_copy_collectives - before == (zc ? 1u : 0u));
}
