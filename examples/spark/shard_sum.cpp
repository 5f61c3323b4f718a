// shard_sum — the Spark data hand-off end to end: each rank reads the DataFrame partition that
// kolo_spark wrote for it (KOLO_DATA_FILE), sums one column of its rows, and allreduces the row
// count and the sum, so every rank holds the totals of the whole DataFrame.
//
//   kolo_spark.run(spark, 4, "shard_sum", ["x", "--expect-rows", "1000", "--expect-sum", "249750"],
//                  df=spark.range(1000).selectExpr("id * 0.5 AS x"))
//
// The column may be a vector/array column (all its cells are summed) or an int64 column, whose
// exact sum is allreduced as int64 too and checked against --expect-int-sum. Prints
// "rank R/N (local l/L, host c/C): shard rows=..., ... correct" and exits 0 when the totals
// match --expect-rows / --expect-sum / --expect-int-sum (1 otherwise, or on any kolo error).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <kolo/kolo.hpp>
#include <kolo/spark/data_file.hpp>

int main(int argc, char** argv) {
  try {
    std::string column;
    std::optional<double> expect_rows, expect_sum;
    std::optional<long long> expect_int_sum;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--expect-int-sum" && i + 1 < argc) {
        expect_int_sum = kolo::parse_env_int(a, argv[++i]);
      } else if ((a == "--expect-rows" || a == "--expect-sum") && i + 1 < argc) {
        const double v = kolo::parse_env_double(a, argv[++i]);
        (a == "--expect-rows" ? expect_rows : expect_sum) = v;
      } else if (!a.empty() && a[0] != '-' && column.empty()) {
        column = a;
      } else {
        std::fprintf(stderr,
                     "usage: shard_sum [column] [--expect-rows N] [--expect-sum S] "
                     "[--expect-int-sum I]\n");
        return 2;
      }
    }

    const kolo::spark::DataShard shard = kolo::spark::load_data_shard();
    const kolo::spark::Field* field = nullptr;
    if (!column.empty()) {
      field = shard.field(column);
      if (field == nullptr) {  // a single cell of a vector, e.g. "features[2]"
        const auto found = shard.column(column);
        if (!found) throw kolo::ConfigError("the data has no column '" + column + "'");
        for (const auto& f : shard.fields) {
          if (*found >= f.first && *found < f.first + f.width) field = &f;
        }
      }
    } else if (!shard.fields.empty()) {
      field = &shard.fields.front();
    }
    if (field == nullptr) throw kolo::ConfigError("the data has no columns");
    const std::size_t first =
        column.empty() || shard.field(column) ? field->first : *shard.column(column);
    const std::size_t width = column.empty() || shard.field(column) ? field->width : 1;
    const std::string name = column.empty() ? field->name : column;
    const bool exact = field->type == kolo::spark::CellType::int64 && width == 1;

    double local_sum = 0.0;
    std::int64_t local_int_sum = 0;
    for (std::size_t r = 0; r < shard.rows; ++r) {
      for (std::size_t c = first; c < first + width; ++c) {
        const double v = shard.at(r, c);
        if (!std::isnan(v)) local_sum += v;  // null rows do not count
        if (exact) local_int_sum += shard.int64_at(r, c);
      }
    }

    auto comm = kolo::Communicator<>::from_env();
    std::vector<double> totals = {static_cast<double>(shard.rows), local_sum};
    comm.allreduce(std::span<double>(totals), kolo::ReduceOp::sum);
    std::vector<std::int64_t> int_total = {local_int_sum};
    comm.allreduce(std::span<std::int64_t>(int_total), kolo::ReduceOp::sum);

    auto close = [](double got, double want) {
      return std::fabs(got - want) <= 1e-9 * std::max(1.0, std::fabs(want));
    };
    const bool ok = (!expect_rows || close(totals[0], *expect_rows)) &&
                    (!expect_sum || close(totals[1], *expect_sum)) &&
                    (!expect_int_sum || (exact && int_total[0] == *expect_int_sum));
    std::printf(
        "rank %d/%d (local %d/%d, host %d/%d): shard rows=%zu, shard sum(%s)=%.17g; "
        "global rows=%.0f, global sum=%.17g%s (expected rows %s, sum %s), %s\n",
        comm.rank(), comm.size(), comm.local_rank(), comm.local_size(), comm.cross_rank(),
        comm.cross_size(), shard.rows, name.c_str(), local_sum, totals[0], totals[1],
        exact ? (", int64 sum=" + std::to_string(int_total[0])).c_str() : "",
        expect_rows ? std::to_string(static_cast<long long>(*expect_rows)).c_str() : "-",
        expect_sum ? std::to_string(*expect_sum).c_str() : "-", ok ? "correct" : "WRONG");
    return ok ? 0 : 1;
  } catch (const kolo::Error& e) {
    std::fprintf(stderr, "shard_sum: %s: %s\n", kolo::error_kind_name(e.kind()), e.what());
    return 1;
  }
}
