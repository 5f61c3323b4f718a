// Host-side parts of the GPU policies that run without a GPU (so in CI): the CUDA environment
// knobs' bad-value sweep, and the NCCL type/op mapping.
#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <string>

#include "kolo/transport/nccl.hpp"

namespace {

kolo::EnvLookup one(const std::string& name, const std::string& value) {
  return [name, value](const std::string& n) -> std::optional<std::string> {
    if (n == name) return value;
    return std::nullopt;
  };
}

}  // namespace

TEST_CASE("CUDA options: defaults and valid values") {
  const auto d = kolo::CudaOptions::from_env(one("UNRELATED", "1"));
  CHECK(d.device == -1);
  CHECK(d.nccl);
  CHECK(d.hierarchical);
  CHECK(kolo::CudaOptions::from_env(one("KOLO_CUDA_DEVICE", "3")).device == 3);
  CHECK_FALSE(kolo::CudaOptions::from_env(one("KOLO_NCCL", "0")).nccl);
  CHECK_FALSE(kolo::CudaOptions::from_env(one("KOLO_NCCL_HIERARCHICAL", "0")).hierarchical);
  CHECK(kolo::CudaOptions::from_env(one("KOLO_CUDA_SPIN_US", "0")).spin_us == 0);
}

TEST_CASE("CUDA options: every bad value is a ConfigError naming the variable and the value") {
  for (const char* var :
       {"KOLO_CUDA_DEVICE", "KOLO_NCCL", "KOLO_CUDA_SPIN_US", "KOLO_NCCL_HIERARCHICAL"}) {
    for (const char* bad : {"", "-7", "abc", "99999999999999999999", "1.5", "2x"}) {
      CAPTURE(var);
      CAPTURE(bad);
      bool threw = false;
      try {
        (void)kolo::CudaOptions::from_env(one(var, bad));
      } catch (const kolo::ConfigError& e) {
        threw = true;
        const std::string what = e.what();
        CHECK(what.find(var) != std::string::npos);
        CHECK(what.find(bad) != std::string::npos);
      }
      CHECK(threw);
    }
  }
}

TEST_CASE("NCCL mapping covers every kolo dtype and op") {
  CHECK(kolo::nccl_detail::dtype(kolo::DataType::bfloat16) == ncclBfloat16);
  CHECK(kolo::nccl_detail::dtype(kolo::DataType::int64) == ncclInt64);
  for (kolo::DataType t : kolo::all_dtypes) CHECK_NOTHROW((void)kolo::nccl_detail::dtype(t));
  CHECK(kolo::nccl_detail::redop(kolo::ReduceOp::average) == ncclAvg);
  for (kolo::ReduceOp op : kolo::all_reduce_ops) CHECK_NOTHROW((void)kolo::nccl_detail::redop(op));
  CHECK_THROWS_AS((void)kolo::nccl_detail::dtype(static_cast<kolo::DataType>(77)),
                  kolo::ConfigError);
}

TEST_CASE("NCCL unique id survives the store's text round trip") {
  ncclUniqueId id{};
  for (std::size_t i = 0; i < sizeof(id.internal); ++i) {
    id.internal[i] = static_cast<char>(i * 37 + 11);
  }
  const std::string hex = kolo::nccl_detail::id_to_hex(id);
  const ncclUniqueId back = kolo::nccl_detail::id_from_hex(hex);
  CHECK(std::memcmp(&id, &back, sizeof(id)) == 0);
  CHECK_THROWS_AS((void)kolo::nccl_detail::id_from_hex("zz"), kolo::Error);
}

TEST_CASE("NCCL results become the matching kolo error, with the NCCL text") {
  CHECK_THROWS_AS(kolo::nccl_detail::throw_result(ncclInvalidArgument, "x"), kolo::ConfigError);
  CHECK_THROWS_AS(kolo::nccl_detail::throw_result(ncclInvalidUsage, "x"), kolo::ConfigError);
  CHECK_THROWS_AS(kolo::nccl_detail::throw_result(ncclRemoteError, "x"), kolo::PeerLostError);
  try {
    kolo::nccl_detail::throw_result(ncclSystemError, "ncclAllReduce");
    FAIL("no throw");
  } catch (const kolo::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("ncclAllReduce") != std::string::npos);
    CHECK(what.find("NCCL error") != std::string::npos);
  }
}
