// kolo/spark/data_file.hpp — reads the data shard the Spark backend wrote for this rank.
//
// `kolo_spark.run(..., df=...)` writes barrier task r's DataFrame partition to a local file and
// exports KOLO_DATA_FILE (its path), KOLO_DATA_FORMAT (`csv` or `f64`), KOLO_DATA_ROWS and
// KOLO_DATA_COLUMNS. The layouts (backends/spark/kolo_spark/data.py, docs/spark.md):
//
//   csv  UTF-8, '\n' line ends, RFC 4180 quoting; a header line of column names, then one line
//        per row; null is an empty field, booleans are `true`/`false`.
//   f64  little-endian: "KOLOF64\0", uint64 rows, uint64 cols, rows*cols float64 row-major.
//
// Nothing here is Spark-specific beyond these two layouts; errors are kolo::ConfigError naming
// the file and, for CSV, the line and column.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"

namespace kolo::spark {

// A numeric shard: `values` holds rows * columns.size() doubles, row-major.
struct DataShard {
  std::vector<std::string> columns;
  std::size_t rows = 0;
  std::vector<double> values;

  std::size_t cols() const { return columns.size(); }
  double at(std::size_t row, std::size_t col) const { return values[row * columns.size() + col]; }
  std::optional<std::size_t> column(std::string_view name) const {
    for (std::size_t i = 0; i < columns.size(); ++i) {
      if (columns[i] == name) return i;
    }
    return std::nullopt;
  }
};

// A CSV file as text fields: the header's names, then each row's fields.
struct CsvTable {
  std::vector<std::string> columns;
  std::vector<std::vector<std::string>> rows;
};

namespace detail {

inline std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigError("cannot open data file '" + path + "': " + std::strerror(errno));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::uint64_t load_u64_le(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

}  // namespace detail

inline constexpr char kF64Magic[8] = {'K', 'O', 'L', 'O', 'F', '6', '4', '\0'};

// Reads an f64 shard. Column names come from `columns` (e.g. KOLO_DATA_COLUMNS) when given,
// else they are c0, c1, ...
inline DataShard read_f64(const std::string& path, std::vector<std::string> columns = {}) {
  const std::string bytes = detail::read_whole_file(path);
  if (bytes.size() < 24 || std::memcmp(bytes.data(), kF64Magic, 8) != 0) {
    throw ConfigError("data file '" + path + "' is not in the f64 layout (no KOLOF64 header)");
  }
  const std::uint64_t rows = detail::load_u64_le(bytes.data() + 8);
  const std::uint64_t cols = detail::load_u64_le(bytes.data() + 16);
  const std::uint64_t body = bytes.size() - 24;
  if (cols != 0 && (rows > body / 8 / cols || rows * cols * 8 != body)) {
    throw ConfigError("data file '" + path + "' says " + std::to_string(rows) + " rows x " +
                      std::to_string(cols) + " columns but holds " + std::to_string(body) +
                      " bytes of values");
  }
  if (!columns.empty() && columns.size() != cols) {
    throw ConfigError("data file '" + path + "' has " + std::to_string(cols) + " columns but " +
                      std::to_string(columns.size()) + " names were given");
  }
  DataShard shard;
  shard.rows = static_cast<std::size_t>(rows);
  if (columns.empty()) {
    for (std::uint64_t c = 0; c < cols; ++c) columns.push_back("c" + std::to_string(c));
  }
  shard.columns = std::move(columns);
  shard.values.resize(static_cast<std::size_t>(rows * cols));
  const char* p = bytes.data() + 24;
  for (auto& v : shard.values) {
    v = std::bit_cast<double>(detail::load_u64_le(p));
    p += 8;
  }
  return shard;
}

// Parses RFC 4180 CSV: fields separated by ',', a field in double quotes may hold ',', '"' (as
// "") and line breaks; "\r\n" line ends are accepted too. The first record is the header.
inline CsvTable read_csv(const std::string& path) {
  const std::string text = detail::read_whole_file(path);
  std::vector<std::vector<std::string>> records;
  std::vector<std::string> record;
  std::string field;
  bool quoted = false;  // inside a quoted field
  bool any = false;     // the current record has started
  std::size_t line = 1;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (quoted) {
      if (ch == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field.push_back('"');
          ++i;
        } else {
          quoted = false;
        }
      } else {
        if (ch == '\n') ++line;
        field.push_back(ch);
      }
      continue;
    }
    if (ch == '"' && field.empty()) {
      quoted = true;
      any = true;
    } else if (ch == ',') {
      record.push_back(std::move(field));
      field.clear();
      any = true;
    } else if (ch == '\n' || ch == '\r') {
      if (ch == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      if (any || !field.empty()) {
        record.push_back(std::move(field));
        records.push_back(std::move(record));
      }
      field.clear();
      record.clear();
      any = false;
      ++line;
    } else {
      field.push_back(ch);
      any = true;
    }
  }
  if (quoted) {
    throw ConfigError("data file '" + path + "': a quoted field opened before line " +
                      std::to_string(line) + " never closes");
  }
  if (any || !field.empty()) {
    record.push_back(std::move(field));
    records.push_back(std::move(record));
  }
  if (records.empty()) throw ConfigError("data file '" + path + "' is empty (no header line)");
  CsvTable table;
  table.columns = std::move(records.front());
  for (std::size_t r = 1; r < records.size(); ++r) {
    if (records[r].size() != table.columns.size()) {
      throw ConfigError("data file '" + path + "': row " + std::to_string(r) + " has " +
                        std::to_string(records[r].size()) + " fields but the header has " +
                        std::to_string(table.columns.size()));
    }
    table.rows.push_back(std::move(records[r]));
  }
  return table;
}

// One CSV field as a number: empty (null) is NaN, true/false are 1/0, else strtod's full parse
// (which also reads nan, inf, -inf).
inline double csv_number(const std::string& field, const std::string& where) {
  if (field.empty()) return std::numeric_limits<double>::quiet_NaN();
  if (field == "true") return 1.0;
  if (field == "false") return 0.0;
  char* end = nullptr;
  const double v = std::strtod(field.c_str(), &end);
  if (end != field.c_str() + field.size()) {
    throw ConfigError(where + " holds '" + field + "', which is not a number");
  }
  return v;
}

// Reads a CSV shard whose columns are all numeric.
inline DataShard read_csv_numeric(const std::string& path) {
  CsvTable table = read_csv(path);
  DataShard shard;
  shard.columns = std::move(table.columns);
  shard.rows = table.rows.size();
  shard.values.reserve(shard.rows * shard.columns.size());
  for (std::size_t r = 0; r < table.rows.size(); ++r) {
    for (std::size_t c = 0; c < shard.columns.size(); ++c) {
      shard.values.push_back(csv_number(table.rows[r][c], "data file '" + path + "', row " +
                                                              std::to_string(r + 1) + ", column '" +
                                                              shard.columns[c] + "'"));
    }
  }
  return shard;
}

// This rank's shard, from KOLO_DATA_FILE and KOLO_DATA_FORMAT (default: the file's suffix);
// the row count is checked against KOLO_DATA_ROWS when that is set.
inline DataShard load_data_shard(const EnvLookup& env = process_env()) {
  const auto path = env("KOLO_DATA_FILE");
  if (!path || path->empty()) {
    throw ConfigError(
        "KOLO_DATA_FILE is not set: start the program with kolo_spark.run(..., df=DataFrame)");
  }
  std::string format = env("KOLO_DATA_FORMAT").value_or("");
  if (format.empty()) {
    format = path->size() > 4 && path->ends_with(".f64") ? "f64" : "csv";
  }
  std::vector<std::string> names;
  if (auto c = env("KOLO_DATA_COLUMNS"); c && !c->empty()) {
    std::string_view rest = *c;
    while (true) {
      const auto comma = rest.find(',');
      names.emplace_back(rest.substr(0, comma));
      if (comma == std::string_view::npos) break;
      rest.remove_prefix(comma + 1);
    }
  }
  DataShard shard;
  if (format == "f64") {
    shard = read_f64(*path);
    // A column name holding a comma makes the list ambiguous: then the names stay c0, c1, ...
    if (names.size() == shard.cols()) shard.columns = std::move(names);
  } else if (format == "csv") {
    shard = read_csv_numeric(*path);
  } else {
    throw ConfigError("KOLO_DATA_FORMAT=" + format + " is not csv or f64");
  }
  if (auto rows = env("KOLO_DATA_ROWS")) {
    const long long expect = parse_env_int("KOLO_DATA_ROWS", *rows);
    if (expect != static_cast<long long>(shard.rows)) {
      throw ConfigError("KOLO_DATA_ROWS=" + *rows + " but data file '" + *path + "' holds " +
                        std::to_string(shard.rows) + " rows");
    }
  }
  return shard;
}

}  // namespace kolo::spark
