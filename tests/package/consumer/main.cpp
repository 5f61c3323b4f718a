// The smallest real use of kolo from another project: reduce two arrays and read a topology.
// Exits 0 only if every number it produced is right.
#if __has_include(<kolo/kolo.hpp>)
#include <kolo/kolo.hpp>  // the umbrella header, once it exists, must also build here
#endif
#include <kolo/core/reduce.hpp>
#include <kolo/spark/data_file.hpp>  // the Spark backend's shard reader comes with the package
#include <kolo/topology/topology.hpp>

#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>

#ifndef KOLO_CONSUMER_MODE
#define KOLO_CONSUMER_MODE "unknown"
#endif

namespace {

int failures = 0;

void expect(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kolo consumer: FAILED: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  // 19 elements: the vector body and the scalar tail of the kernel both run.
  constexpr int n = 19;
  float a[n], b[n], sum[n];
  for (int i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i);
    b[i] = 0.5f * static_cast<float>(i) + 1.0f;
  }
  kolo::reduce(sum, a, b, n, kolo::DataType::float32, kolo::ReduceOp::sum);
  for (int i = 0; i < n; ++i) expect(sum[i] == 1.5f * static_cast<float>(i) + 1.0f, "float sum");

  std::int32_t x[4] = {7, -7, 100, 3};
  const std::int32_t y[4] = {0, 0, -1, 4};
  kolo::reduce(x, x, y, 4, kolo::DataType::int32, kolo::ReduceOp::average);
  kolo::finish_average(x, 4, kolo::DataType::int32, 2);
  expect(x[0] == 3 && x[1] == -3 && x[2] == 49 && x[3] == 3, "int32 average");

  kolo::float16 h[2] = {kolo::float16(1.5f), kolo::float16(-4.0f)};
  const kolo::float16 g[2] = {kolo::float16(2.25f), kolo::float16(2.0f)};
  kolo::reduce(h, h, g, 2, kolo::DataType::float16, kolo::ReduceOp::max);
  expect(static_cast<float>(h[0]) == 2.25f && static_cast<float>(h[1]) == 2.0f, "float16 max");

  const std::map<std::string, std::string> env{{"KOLO_RANK", "0"}, {"KOLO_SIZE", "1"}};
  const auto topo = kolo::Topology::from_env([&](const std::string& k) {
    const auto it = env.find(k);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  });
  expect(topo.rank == 0 && topo.size == 1, "topology from a map");

  // A data shard as kolo_spark writes it (csv): int64 exact above 2^53, a string column kept.
  const char* shard_path = "kolo-consumer-shard.csv";
  if (std::FILE* f = std::fopen(shard_path, "w")) {
    std::fputs("id,name,x\n9007199254740993,\"a, b\",0.5\n", f);
    std::fclose(f);
  }
  const auto shard = kolo::spark::read_csv_shard(shard_path, {"int64", "text", "float64"});
  std::remove(shard_path);
  expect(shard.rows == 1 && shard.int64_at(0, 0) == 9007199254740993LL &&
             shard.text_at(0, 1) == "a, b" && shard.at(0, 2) == 0.5,
         "spark data shard");

  if (failures != 0) return 1;
  std::printf("kolo consumer (%s): ok\n", KOLO_CONSUMER_MODE);
  return 0;
}
