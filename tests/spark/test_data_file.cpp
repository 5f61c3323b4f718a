// kolo/spark/data_file.hpp: the C++ side of the Spark data hand-off reads exactly what
// kolo_spark.data writes (the CSV below is that writer's output, byte for byte).
#include <doctest/doctest.h>
#include <unistd.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <kolo/spark/data_file.hpp>

namespace {

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& suffix, const std::string& bytes) {
    path = "/tmp/kolo-spark-data-test-" + std::to_string(::getpid()) + "-" +
           std::to_string(counter()++) + suffix;
    std::ofstream(path, std::ios::binary) << bytes;
  }
  ~TempFile() { std::remove(path.c_str()); }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

std::string f64_bytes(std::uint64_t rows, std::uint64_t cols, const std::vector<double>& values) {
  std::string out("KOLOF64\0", 8);
  auto put = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  put(rows);
  put(cols);
  for (double v : values) put(std::bit_cast<std::uint64_t>(v));
  return out;
}

kolo::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// kolo_spark.data.write_rows([(1,'plain',0.5,True), (2,'a, comma',None,False),
//   (3,'say "hi"',nan,None), (4,'two\nlines',-1e20,True), (5,'',inf,False)], ..., 'csv', ...)
const char* kPythonCsv =
    "id,name,v,flag\n1,plain,0.5,true\n2,\"a, comma\",,false\n3,\"say \"\"hi\"\"\",nan,\n"
    "4,\"two\nlines\",-1e+20,true\n5,,inf,false\n";

}  // namespace

TEST_CASE("spark data: CSV as kolo_spark writes it, quoting included") {
  TempFile f(".csv", kPythonCsv);
  const auto table = kolo::spark::read_csv(f.path);
  CHECK(table.columns == std::vector<std::string>{"id", "name", "v", "flag"});
  REQUIRE(table.rows.size() == 5);
  CHECK(table.rows[1][1] == "a, comma");
  CHECK(table.rows[2][1] == "say \"hi\"");
  CHECK(table.rows[3][1] == "two\nlines");
  CHECK(table.rows[4][1].empty());
  CHECK(table.rows[1][2].empty());  // null
  CHECK(kolo::spark::csv_number(table.rows[0][2], "x") == 0.5);
  CHECK(std::isnan(kolo::spark::csv_number(table.rows[1][2], "x")));
  CHECK(std::isnan(kolo::spark::csv_number(table.rows[2][2], "x")));
  CHECK(kolo::spark::csv_number(table.rows[3][2], "x") == -1e20);
  CHECK(std::isinf(kolo::spark::csv_number(table.rows[4][2], "x")));
  CHECK(kolo::spark::csv_number("true", "x") == 1.0);
  CHECK(kolo::spark::csv_number("false", "x") == 0.0);
  CHECK_THROWS_WITH_AS(kolo::spark::read_csv_numeric(f.path),
                       doctest::Contains("column 'name' holds 'plain', which is not a number"),
                       kolo::ConfigError);
}

TEST_CASE("spark data: CSV with CRLF line ends and a lone empty quoted field") {
  TempFile f(".csv", "a,b\r\n1,2\r\n\"\",3\r\n");
  const auto table = kolo::spark::read_csv(f.path);
  REQUIRE(table.rows.size() == 2);
  CHECK(table.rows[1][0].empty());
  CHECK(table.rows[1][1] == "3");
  TempFile one(".csv", "v\n\"\"\n7\n");  // one column, a null row: Python writes ""
  const auto shard = kolo::spark::read_csv_numeric(one.path);
  REQUIRE(shard.rows == 2);
  CHECK(std::isnan(shard.at(0, 0)));
  CHECK(shard.at(1, 0) == 7.0);
}

TEST_CASE("spark data: CSV errors name the file and the place") {
  TempFile ragged(".csv", "a,b\n1\n");
  CHECK_THROWS_WITH_AS(kolo::spark::read_csv(ragged.path),
                       doctest::Contains("row 1 has 1 fields but the header has 2"),
                       kolo::ConfigError);
  TempFile open_quote(".csv", "a\n\"never closed\n");
  CHECK_THROWS_AS(kolo::spark::read_csv(open_quote.path), kolo::ConfigError);
  CHECK_THROWS_WITH_AS(kolo::spark::read_csv("/nonexistent/kolo.csv"),
                       doctest::Contains("cannot open data file '/nonexistent/kolo.csv'"),
                       kolo::ConfigError);
}

TEST_CASE("spark data: f64 layout") {
  TempFile f(".f64", f64_bytes(2, 3, {1.0, 2.5, -3.0, 4.0, NAN, 6.0}));
  const auto shard = kolo::spark::read_f64(f.path, {"a", "b", "c"});
  CHECK(shard.rows == 2);
  CHECK(shard.cols() == 3);
  CHECK(shard.at(0, 1) == 2.5);
  CHECK(shard.at(1, 2) == 6.0);
  CHECK(std::isnan(shard.at(1, 1)));
  CHECK(shard.column("c") == std::optional<std::size_t>(2));
  CHECK(kolo::spark::read_f64(f.path).columns == std::vector<std::string>{"c0", "c1", "c2"});

  TempFile empty(".f64", f64_bytes(0, 2, {}));
  CHECK(kolo::spark::read_f64(empty.path).rows == 0);

  TempFile truncated(".f64", f64_bytes(2, 3, {1.0, 2.0}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_f64(truncated.path),
                       doctest::Contains("says 2 rows x 3 columns but holds 16 bytes"),
                       kolo::ConfigError);
  TempFile not_f64(".f64", "id,x\n1,2\n");
  CHECK_THROWS_WITH_AS(kolo::spark::read_f64(not_f64.path), doctest::Contains("not in the f64"),
                       kolo::ConfigError);
}

TEST_CASE("spark data: load_data_shard from the environment") {
  TempFile f(".f64", f64_bytes(3, 1, {1.0, 2.0, 3.0}));
  auto shard = kolo::spark::load_data_shard(env_of({{"KOLO_DATA_FILE", f.path},
                                                    {"KOLO_DATA_FORMAT", "f64"},
                                                    {"KOLO_DATA_ROWS", "3"},
                                                    {"KOLO_DATA_COLUMNS", "x"}}));
  CHECK(shard.rows == 3);
  CHECK(shard.columns == std::vector<std::string>{"x"});
  CHECK(kolo::spark::load_data_shard(env_of({{"KOLO_DATA_FILE", f.path}})).rows == 3);  // suffix

  TempFile csv(".csv", "x\n1\n2\n");
  CHECK(kolo::spark::load_data_shard(env_of({{"KOLO_DATA_FILE", csv.path}})).rows == 2);

  CHECK_THROWS_WITH_AS(kolo::spark::load_data_shard(env_of({})),
                       doctest::Contains("KOLO_DATA_FILE is not set"), kolo::ConfigError);
  CHECK_THROWS_WITH_AS(
      kolo::spark::load_data_shard(env_of({{"KOLO_DATA_FILE", f.path}, {"KOLO_DATA_ROWS", "4"}})),
      doctest::Contains("KOLO_DATA_ROWS=4 but data file"), kolo::ConfigError);
  CHECK_THROWS_WITH_AS(kolo::spark::load_data_shard(
                           env_of({{"KOLO_DATA_FILE", f.path}, {"KOLO_DATA_FORMAT", "parquet"}})),
                       doctest::Contains("KOLO_DATA_FORMAT=parquet is not csv or f64"),
                       kolo::ConfigError);
}
