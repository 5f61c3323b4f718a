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

// A bin file as kolo_spark.data writes it: (type code, width, name) per column, then cells.
struct BinColumn {
  int code;
  std::uint32_t width;
  std::string name;
};
std::string bin_bytes(std::uint64_t rows, const std::vector<BinColumn>& cols,
                      const std::vector<std::uint64_t>& cells) {
  std::string out("KOLOBIN1", 8);
  auto put = [&](std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  };
  std::uint64_t per_row = 0;
  for (const auto& c : cols) per_row += c.width;
  put(rows, 8);
  put(cols.size(), 8);
  put(per_row, 8);
  for (const auto& c : cols) {
    put(static_cast<std::uint64_t>(c.code), 4);  // the type byte and 3 zero bytes
    put(c.width, 4);
    put(c.name.size(), 4);
    out += c.name;
  }
  while (out.size() % 8 != 0) out.push_back('\0');
  for (auto v : cells) put(v, 8);
  return out;
}
std::uint64_t d(double v) {
  return std::bit_cast<std::uint64_t>(v);
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
                       doctest::Contains("KOLO_DATA_FORMAT=parquet is not csv, f64 or bin"),
                       kolo::ConfigError);
}

TEST_CASE("spark data: bin layout keeps int64 exact and flattens vectors") {
  const std::int64_t big = (std::int64_t{1} << 53) + 1;  // not a double
  TempFile f(".bin",
             bin_bytes(2, {{2, 1, "id"}, {3, 3, "features"}, {1, 1, "label"}},
                       {static_cast<std::uint64_t>(big), d(0.5), d(1.5), d(2.5), d(1.0),
                        static_cast<std::uint64_t>(-big), d(-1.0), d(0.0), d(NAN), d(0.0)}));
  const auto shard = kolo::spark::read_bin(f.path);
  CHECK(shard.rows == 2);
  CHECK(shard.cols() == 5);
  CHECK(shard.columns ==
        std::vector<std::string>{"id", "features[0]", "features[1]", "features[2]", "label"});
  REQUIRE(shard.fields.size() == 3);
  CHECK(shard.fields[1].type == kolo::spark::CellType::vector);
  CHECK((shard.fields[1].first == 1 && shard.fields[1].width == 3));
  CHECK(shard.int64_at(0, 0) == big);
  CHECK(shard.int64_at(1, 0) == -big);
  CHECK(shard.at(0, 0) == static_cast<double>(big));  // the nearest double
  const auto* features = shard.field("features");
  REQUIRE(features != nullptr);
  const auto row0 = shard.cells(0, *features);
  CHECK(std::vector<double>(row0.begin(), row0.end()) == std::vector<double>{0.5, 1.5, 2.5});
  CHECK(std::isnan(shard.cells(1, *features)[2]));
  CHECK(shard.at(1, *shard.column("label")) == 0.0);
  CHECK_THROWS_WITH_AS(shard.int64_at(0, 4), doctest::Contains("'label' is not an int64"),
                       kolo::ConfigError);

  TempFile empty(".bin", bin_bytes(0, {{1, 1, "x"}, {3, 0, "v"}}, {}));
  CHECK(kolo::spark::read_bin(empty.path).rows == 0);
  TempFile short_body(".bin", bin_bytes(2, {{1, 1, "x"}}, {d(1.0)}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_bin(short_body.path),
                       doctest::Contains("says 2 rows x 1 cells but holds 8 bytes"),
                       kolo::ConfigError);
  TempFile bad_type(".bin", bin_bytes(1, {{9, 1, "x"}}, {d(1.0)}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_bin(bad_type.path),
                       doctest::Contains("column 'x' has type code 9"), kolo::ConfigError);
  CHECK_THROWS_WITH_AS(kolo::spark::read_bin(short_body.path + ".missing"),
                       doctest::Contains("cannot open data file"), kolo::ConfigError);
}

// kolo_spark.data.write_rows([(9007199254740993, 'a, b', [1.0, 2.0], 0.5, True),
//   (-7, None, None, None, False)], ..., 'csv', ...) with KOLO_DATA_TYPES
//   int64,text,vector,float64,bool
const char* kTypedCsv =
    "id,name,v,x,flag\n9007199254740993,\"a, b\",\"[1.0,2.0]\",0.5,true\n-7,,,,false\n";

TEST_CASE("spark data: CSV with string, int64 and vector columns") {
  TempFile f(".csv", kTypedCsv);
  const auto shard =
      kolo::spark::read_csv_shard(f.path, {"int64", "text", "vector", "float64", "bool"});
  CHECK(shard.rows == 2);
  CHECK(shard.columns == std::vector<std::string>{"id", "name", "v[0]", "v[1]", "x", "flag"});
  CHECK(shard.int64_at(0, 0) == 9007199254740993LL);
  CHECK(shard.int64_at(1, 0) == -7);
  CHECK(shard.text_at(0, 1) == "a, b");
  CHECK(shard.text_at(1, 1).empty());
  CHECK(std::isnan(shard.at(0, 1)));  // text is NaN among the numbers
  CHECK(shard.at(0, 2) == 1.0);
  CHECK(shard.at(0, 3) == 2.0);
  CHECK(std::isnan(shard.at(1, 2)));  // a null vector
  CHECK(shard.at(0, 4) == 0.5);
  CHECK(std::isnan(shard.at(1, 4)));
  CHECK(shard.int64_at(0, 5) == 1);
  CHECK(shard.int64_at(1, 5) == 0);

  // Without types: inferred from the fields, the same answer here.
  const auto inferred = kolo::spark::read_csv_shard(f.path);
  CHECK(inferred.columns == shard.columns);
  CHECK(inferred.int64_at(0, 0) == 9007199254740993LL);
  CHECK(inferred.text_at(0, 1) == "a, b");

  // ... and through the environment, as a rank sees it.
  const auto env =
      kolo::spark::load_data_shard(env_of({{"KOLO_DATA_FILE", f.path},
                                           {"KOLO_DATA_FORMAT", "csv"},
                                           {"KOLO_DATA_ROWS", "2"},
                                           {"KOLO_DATA_TYPES", "int64,text,vector,float64,bool"}}));
  CHECK(env.int64_at(0, 0) == 9007199254740993LL);
  CHECK(env.field("name")->type == kolo::spark::CellType::text);

  CHECK_THROWS_WITH_AS(kolo::spark::read_csv_shard(f.path, {"int64"}),
                       doctest::Contains("has 5 columns but 1 types were given"),
                       kolo::ConfigError);
  CHECK_THROWS_WITH_AS(
      kolo::spark::read_csv_shard(f.path, {"int64", "int64", "vector", "float64", "bool"}),
      doctest::Contains("column 'name' holds 'a, b', which is not an int64"), kolo::ConfigError);
  TempFile ragged(".csv", "v\n\"[1,2]\"\n\"[3]\"\n");
  CHECK_THROWS_WITH_AS(kolo::spark::read_csv_shard(ragged.path, {"vector"}),
                       doctest::Contains("has 1 values but the column's first vector has 2"),
                       kolo::ConfigError);
}

// Issue 53: a header's counts are checked against the file (and for plausibility) before
// anything is allocated: a zero-row shard naming 2^40 columns, or a vector of 2^31 cells, and
// rows without a column are clear errors naming the file, not a huge allocation or a long loop.
TEST_CASE("spark data: lying headers of zero-row and zero-column shards") {
  TempFile wide(".f64", f64_bytes(0, std::uint64_t{1} << 17, {}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_f64(wide.path),
                       doctest::Contains("says 0 rows x 131072 columns: more than 65536 cells"),
                       kolo::ConfigError);
  TempFile huge(".f64", f64_bytes(0, std::uint64_t{1} << 40, {}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_f64(huge.path), doctest::Contains(huge.path.c_str()),
                       kolo::ConfigError);
  TempFile no_cols(".f64", f64_bytes(std::uint64_t{1} << 60, 0, {}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_f64(no_cols.path),
                       doctest::Contains("rows without a single column"), kolo::ConfigError);
  CHECK(kolo::spark::read_f64(TempFile(".f64", f64_bytes(0, 3, {})).path).cols() == 3);

  TempFile vec(".bin", bin_bytes(0, {{1, 1, "x"}, {3, 0x80000000u, "v"}}, {}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_bin(vec.path),
                       doctest::Contains("says 0 rows x 2147483649 cells: more than 65536"),
                       kolo::ConfigError);
  TempFile bin_no_cols(".bin", bin_bytes(std::uint64_t{1} << 62, {}, {}));
  CHECK_THROWS_WITH_AS(kolo::spark::read_bin(bin_no_cols.path),
                       doctest::Contains("rows without a single column"), kolo::ConfigError);
}
