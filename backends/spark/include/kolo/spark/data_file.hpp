// kolo/spark/data_file.hpp — reads the data shard the Spark backend wrote for this rank.
//
// `kolo_spark.run(..., df=...)` writes barrier task r's DataFrame partition to a local file and
// exports KOLO_DATA_FILE (its path), KOLO_DATA_FORMAT (`csv`, `f64` or `bin`), KOLO_DATA_ROWS,
// KOLO_DATA_COLUMNS and KOLO_DATA_TYPES. The layouts (docs/spark.md, "Data from a DataFrame"):
//
//   csv  UTF-8, '\n' line ends, RFC 4180 quoting; a header line of column names, then one line
//        per row; null is an empty field, booleans are `true`/`false`, integers exact decimal,
//        vectors/arrays `[v1,v2,...]`, strings as they are.
//   f64  little-endian: "KOLOF64\0", uint64 rows, uint64 cols, rows*cols float64 row-major.
//   bin  little-endian: "KOLOBIN1", uint64 rows, uint64 columns, uint64 cells per row; per
//        column uint8 type (1 float64, 2 int64, 3 vector), 3 zero bytes, uint32 width, uint32
//        name length, name; zero padding to a multiple of 8; rows*cells 8-byte cells, row-major.
//
// The API, all in namespace kolo::spark:
//
//   DataShard load_data_shard(env = process_env())   this rank's shard, from the variables above
//   DataShard read_bin(path)                          a bin file
//   DataShard read_f64(path, names = {})              an f64 file (names default c0, c1, ...)
//   DataShard read_csv_shard(path, types = {})        a csv file, typed by `types` (the
//                                                     KOLO_DATA_TYPES names) or inferred
//   DataShard read_csv_numeric(path)                  a csv file whose columns are all numbers
//   CsvTable  read_csv(path)                          a csv file as text fields
//   double    csv_number(field, where)                one csv field as a number
//
// A DataShard is a table of cells: every DataFrame column (a Field) takes `width` consecutive
// cells of a row, 1 for scalars and the length for a vector/array column, whose cells are named
// name[0], name[1], .... `values` holds every cell as a double (int64 cells rounded to the
// nearest double, text cells NaN, null NaN); int64 cells are also kept exactly (int64_at) and
// text cells as text (text_at). Errors are kolo::ConfigError naming the file and, where it
// applies, the row and column.
#pragma once

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kolo/core/config.hpp"
#include "kolo/core/env.hpp"
#include "kolo/core/error.hpp"
#include "kolo/spark/spark_config.hpp"

namespace kolo::spark {

// What a column holds. A boolean column is int64 (1/0).
enum class CellType : std::uint8_t { float64 = 1, int64 = 2, vector = 3, text = 4 };

inline const char* cell_type_name(CellType t) {
  switch (t) {
    case CellType::float64:
      return "float64";
    case CellType::int64:
      return "int64";
    case CellType::vector:
      return "vector";
    case CellType::text:
      return "text";
  }
  return "?";
}

// One column of the DataFrame: `width` cells of every row, from cell `first` on.
struct Field {
  std::string name;
  CellType type = CellType::float64;
  std::size_t width = 1;
  std::size_t first = 0;
};

// A shard: `rows` rows of cols() cells each.
struct DataShard {
  std::vector<std::string> columns;  // one name per cell (name, or name[i] in a vector field)
  std::vector<Field> fields;         // the DataFrame's columns
  std::size_t rows = 0;
  std::vector<double> values;  // rows * cols(), row-major: every cell as a double
  // Exact int64 cells and text cells: int_slot[c] / text_slot[c] is cell c's index among a
  // row's int64 / text cells (-1: not one), `ints` and `texts` hold them row-major.
  std::vector<int> int_slot, text_slot;
  std::vector<std::int64_t> ints;
  std::vector<std::string> texts;

  std::size_t cols() const { return columns.size(); }
  double at(std::size_t row, std::size_t col) const { return values[row * columns.size() + col]; }
  std::optional<std::size_t> column(std::string_view name) const {
    for (std::size_t i = 0; i < columns.size(); ++i) {
      if (columns[i] == name) return i;
    }
    return std::nullopt;
  }
  const Field* field(std::string_view name) const {
    for (const auto& f : fields) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }
  // An int64 cell, exact (a null cell of a CSV int64 column reads 0: its at() is NaN).
  std::int64_t int64_at(std::size_t row, std::size_t col) const {
    const int slot = col < int_slot.size() ? int_slot[col] : -1;
    if (slot < 0) {
      throw ConfigError("data shard: cell '" + cell_name(col) + "' is not an int64 column");
    }
    return ints[row * int_cells() + static_cast<std::size_t>(slot)];
  }
  // A text cell (a string column of a CSV shard).
  const std::string& text_at(std::size_t row, std::size_t col) const {
    const int slot = col < text_slot.size() ? text_slot[col] : -1;
    if (slot < 0) throw ConfigError("data shard: cell '" + cell_name(col) + "' is not text");
    return texts[row * text_cells() + static_cast<std::size_t>(slot)];
  }
  // A field's cells of one row (a vector column's values; one cell for a scalar).
  std::span<const double> cells(std::size_t row, const Field& f) const {
    return std::span<const double>(values).subspan(row * cols() + f.first, f.width);
  }
  std::size_t int_cells() const { return count_slots(int_slot); }
  std::size_t text_cells() const { return count_slots(text_slot); }

 private:
  std::string cell_name(std::size_t col) const {
    if (col < columns.size()) return columns[col];
    std::string name = "#";  // not "#" + std::to_string(): GCC 12 -Wrestrict false positive
    name += std::to_string(col);
    return name;
  }
  static std::size_t count_slots(const std::vector<int>& slots) {
    std::size_t n = 0;
    for (int s : slots) n += s >= 0 ? 1 : 0;
    return n;
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

inline std::uint32_t load_u32_le(const char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Lays out `fields` (their types and widths set) as cells: names, slots, sizes.
inline void layout(DataShard& shard) {
  shard.columns.clear();
  shard.int_slot.clear();
  shard.text_slot.clear();
  int ints = 0;
  int texts = 0;
  for (auto& f : shard.fields) {
    f.first = shard.columns.size();
    for (std::size_t i = 0; i < f.width; ++i) {
      shard.columns.push_back(f.type == CellType::vector ? f.name + "[" + std::to_string(i) + "]"
                                                         : f.name);
      shard.int_slot.push_back(f.type == CellType::int64 ? ints++ : -1);
      shard.text_slot.push_back(f.type == CellType::text ? texts++ : -1);
    }
  }
}

inline std::vector<std::string> split_commas(std::string_view text) {
  std::vector<std::string> out;
  while (true) {
    const auto comma = text.find(',');
    out.emplace_back(text.substr(0, comma));
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return out;
}

inline std::optional<std::int64_t> parse_int64(const std::string& field) {
  std::int64_t v = 0;
  const char* end = field.data() + field.size();
  const auto r = std::from_chars(field.data(), end, v);
  if (r.ec != std::errc() || r.ptr != end || field.empty()) return std::nullopt;
  return v;
}

// The cells of a shard's row that no data bounds: a shard of zero rows names its columns (and
// a vector column's cells) without a byte of data behind them. kolo_spark writes a zero-row
// shard with its scalar columns only (a vector's width is its first row's length), so more than
// this many cells there is a lying header, not a DataFrame.
inline constexpr std::uint64_t kMaxCellsWithoutRows = std::uint64_t{1} << 16;

// Why a header's `rows` x `cells` (already checked to match the file's bytes) cannot be a
// shard, or "": rows without a single cell (nothing bounds how many), or a zero-row shard
// claiming more cells per row than any writer makes. Checked before anything is allocated.
inline std::string implausible_shape(std::uint64_t rows, std::uint64_t cells) {
  if (rows != 0 && cells == 0) return "rows without a single column cannot be read back";
  if (rows == 0 && cells > kMaxCellsWithoutRows) {
    return "more than " + std::to_string(kMaxCellsWithoutRows) +
           " cells per row in a shard of no rows (a lying header)";
  }
  return {};
}

}  // namespace detail

inline constexpr char kF64Magic[8] = {'K', 'O', 'L', 'O', 'F', '6', '4', '\0'};
inline constexpr char kBinMagic[8] = {'K', 'O', 'L', 'O', 'B', 'I', 'N', '1'};

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
  if (const std::string why = detail::implausible_shape(rows, cols); !why.empty()) {
    throw ConfigError("data file '" + path + "' says " + std::to_string(rows) + " rows x " +
                      std::to_string(cols) + " columns: " + why);
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
  for (auto& name : columns) shard.fields.push_back({std::move(name), CellType::float64, 1, 0});
  detail::layout(shard);
  shard.values.resize(static_cast<std::size_t>(rows * cols));
  const char* p = bytes.data() + 24;
  for (auto& v : shard.values) {
    v = std::bit_cast<double>(detail::load_u64_le(p));
    p += 8;
  }
  return shard;
}

// Reads a bin shard: typed columns (int64 exact), vector/array columns flattened.
inline DataShard read_bin(const std::string& path) {
  const std::string bytes = detail::read_whole_file(path);
  const auto bad = [&](const std::string& what) {
    return ConfigError("data file '" + path + "': " + what);
  };
  if (bytes.size() < 32 || std::memcmp(bytes.data(), kBinMagic, 8) != 0) {
    throw ConfigError("data file '" + path + "' is not in the bin layout (no KOLOBIN1 header)");
  }
  const std::uint64_t rows = detail::load_u64_le(bytes.data() + 8);
  const std::uint64_t ncols = detail::load_u64_le(bytes.data() + 16);
  const std::uint64_t cells = detail::load_u64_le(bytes.data() + 24);
  std::size_t pos = 32;
  DataShard shard;
  std::uint64_t width_sum = 0;
  for (std::uint64_t c = 0; c < ncols; ++c) {
    if (bytes.size() < pos + 12) throw bad("the header ends inside column " + std::to_string(c));
    const auto code = static_cast<unsigned char>(bytes[pos]);
    const std::uint32_t width = detail::load_u32_le(bytes.data() + pos + 4);
    const std::uint32_t name_len = detail::load_u32_le(bytes.data() + pos + 8);
    pos += 12;
    if (bytes.size() < pos + name_len) throw bad("the header ends inside a column name");
    Field f;
    f.name = bytes.substr(pos, name_len);
    pos += name_len;
    if (code < 1 || code > 3) {
      throw bad("column '" + f.name + "' has type code " + std::to_string(code) +
                " (expected 1 float64, 2 int64 or 3 vector)");
    }
    f.type = static_cast<CellType>(code);
    f.width = width;
    if (f.type != CellType::vector && width != 1) {
      throw bad("scalar column '" + f.name + "' has width " + std::to_string(width));
    }
    width_sum += width;
    shard.fields.push_back(std::move(f));
  }
  if (width_sum != cells) {
    throw bad("the columns' widths add up to " + std::to_string(width_sum) + " cells but the " +
              "header says " + std::to_string(cells) + " per row");
  }
  if (const std::string why = detail::implausible_shape(rows, cells); !why.empty()) {
    throw bad("says " + std::to_string(rows) + " rows x " + std::to_string(cells) +
              " cells: " + why);
  }
  pos += (8 - pos % 8) % 8;
  const std::uint64_t body = bytes.size() < pos ? 0 : bytes.size() - pos;
  if (bytes.size() < pos || (cells != 0 && (rows > body / 8 / cells || rows * cells * 8 != body)) ||
      (cells == 0 && body != 0)) {
    throw bad("says " + std::to_string(rows) + " rows x " + std::to_string(cells) +
              " cells but holds " + std::to_string(body) + " bytes of cells");
  }
  detail::layout(shard);
  shard.rows = static_cast<std::size_t>(rows);
  const std::size_t n_ints = shard.int_cells();
  shard.values.resize(static_cast<std::size_t>(rows * cells));
  shard.ints.resize(shard.rows * n_ints);
  const char* p = bytes.data() + pos;
  for (std::size_t r = 0; r < shard.rows; ++r) {
    for (std::size_t c = 0; c < cells; ++c) {
      const std::uint64_t raw = detail::load_u64_le(p);
      p += 8;
      const int slot = shard.int_slot[c];
      if (slot >= 0) {
        const auto v = static_cast<std::int64_t>(raw);
        shard.ints[r * n_ints + static_cast<std::size_t>(slot)] = v;
        shard.values[r * cells + c] = static_cast<double>(v);
      } else {
        shard.values[r * cells + c] = std::bit_cast<double>(raw);
      }
    }
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

namespace detail {

// "[1.5,2,nan]" -> its numbers.
inline std::vector<double> csv_vector(const std::string& field, const std::string& where) {
  if (field.size() < 2 || field.front() != '[' || field.back() != ']') {
    throw ConfigError(where + " holds '" + field + "', which is not a vector ([v1,v2,...])");
  }
  std::vector<double> out;
  const std::string body = field.substr(1, field.size() - 2);
  if (body.find_first_not_of(' ') == std::string::npos) return out;
  for (auto& item : split_commas(body)) {
    const auto b = item.find_first_not_of(' ');
    const auto e = item.find_last_not_of(' ');
    out.push_back(csv_number(b == std::string::npos ? "" : item.substr(b, e - b + 1), where));
  }
  return out;
}

inline CellType csv_type_of(const std::string& name, const std::string& path,
                            const std::string& column) {
  if (name == "float64") return CellType::float64;
  if (name == "int64" || name == "bool") return CellType::int64;
  if (name == "vector") return CellType::vector;
  if (name == "text") return CellType::text;
  throw ConfigError("data file '" + path + "': column '" + column + "' has type '" + name +
                    "' (expected int64, float64, bool, vector or text)");
}

// A column's type from its fields: integers (all fitting int64) -> int64, numbers -> float64,
// [..] -> vector, anything else -> text. Null (empty) fields do not decide.
inline CellType infer_csv_type(const CsvTable& t, std::size_t c) {
  bool all_int = true, all_num = true, all_vec = true, any = false;
  for (const auto& row : t.rows) {
    const std::string& f = row[c];
    if (f.empty()) continue;
    any = true;
    if (all_int && !parse_int64(f) && f != "true" && f != "false") all_int = false;
    if (all_num) {
      char* end = nullptr;
      std::strtod(f.c_str(), &end);
      if (end != f.c_str() + f.size() && f != "true" && f != "false") all_num = false;
    }
    if (all_vec && (f.front() != '[' || f.back() != ']')) all_vec = false;
  }
  if (!any) return CellType::float64;
  if (all_int) return CellType::int64;
  if (all_num) return CellType::float64;
  return all_vec ? CellType::vector : CellType::text;
}

}  // namespace detail

// Reads a CSV shard with its columns typed by `types` (one KOLO_DATA_TYPES name per column:
// int64, float64, bool, vector, text) or, when `types` is empty, by their fields. int64 cells
// are exact; text columns keep their text (NaN in `values`), so numeric reads of the other
// columns work; a vector column is flattened into the width of its first non-null row.
inline DataShard read_csv_shard(const std::string& path,
                                const std::vector<std::string>& types = {}) {
  CsvTable table = read_csv(path);
  const std::size_t n = table.columns.size();
  if (!types.empty() && types.size() != n) {
    throw ConfigError("data file '" + path + "' has " + std::to_string(n) + " columns but " +
                      std::to_string(types.size()) + " types were given");
  }
  DataShard shard;
  shard.rows = table.rows.size();
  for (std::size_t c = 0; c < n; ++c) {
    Field f;
    f.name = table.columns[c];
    f.type = types.empty() ? detail::infer_csv_type(table, c)
                           : detail::csv_type_of(types[c], path, f.name);
    if (f.type == CellType::vector) {
      f.width = 0;
      for (std::size_t r = 0; r < table.rows.size(); ++r) {
        if (table.rows[r][c].empty()) continue;
        f.width = detail::csv_vector(table.rows[r][c], "data file '" + path + "', row " +
                                                           std::to_string(r + 1) + ", column '" +
                                                           f.name + "'")
                      .size();
        break;
      }
    }
    shard.fields.push_back(std::move(f));
  }
  detail::layout(shard);
  const std::size_t cells = shard.cols();
  const std::size_t n_ints = shard.int_cells();
  const std::size_t n_texts = shard.text_cells();
  shard.values.resize(shard.rows * cells);
  shard.ints.resize(shard.rows * n_ints);
  shard.texts.resize(shard.rows * n_texts);
  constexpr double nan = std::numeric_limits<double>::quiet_NaN();
  for (std::size_t r = 0; r < shard.rows; ++r) {
    double* out = shard.values.data() + r * cells;
    for (std::size_t c = 0; c < n; ++c) {
      const Field& f = shard.fields[c];
      const std::string& field = table.rows[r][c];
      const auto where = [&] {
        return "data file '" + path + "', row " + std::to_string(r + 1) + ", column '" + f.name +
               "'";
      };
      switch (f.type) {
        case CellType::text:
          out[f.first] = nan;
          shard.texts[r * n_texts + static_cast<std::size_t>(shard.text_slot[f.first])] = field;
          break;
        case CellType::int64: {
          std::int64_t v = 0;
          if (field == "true" || field == "false") {
            v = field == "true" ? 1 : 0;
          } else if (!field.empty()) {
            const auto parsed = detail::parse_int64(field);
            if (!parsed) {
              throw ConfigError(where() + " holds '" + field + "', which is not an int64");
            }
            v = *parsed;
          }
          shard.ints[r * n_ints + static_cast<std::size_t>(shard.int_slot[f.first])] = v;
          out[f.first] = field.empty() ? nan : static_cast<double>(v);
          break;
        }
        case CellType::vector: {
          if (field.empty()) {
            for (std::size_t i = 0; i < f.width; ++i) out[f.first + i] = nan;
            break;
          }
          const auto v = detail::csv_vector(field, where());
          if (v.size() != f.width) {
            throw ConfigError(where() + " has " + std::to_string(v.size()) + " values but the " +
                              "column's first vector has " + std::to_string(f.width));
          }
          std::copy(v.begin(), v.end(), out + f.first);
          break;
        }
        case CellType::float64:
          out[f.first] = csv_number(field, where());
          break;
      }
    }
  }
  return shard;
}

// Reads a CSV shard whose columns are all numeric (integers exact, as int64 cells); a column
// holding anything else is an error naming it.
inline DataShard read_csv_numeric(const std::string& path) {
  const CsvTable table = read_csv(path);
  std::vector<std::string> types;
  for (std::size_t c = 0; c < table.columns.size(); ++c) {
    const CellType t = detail::infer_csv_type(table, c);
    if (t == CellType::text || t == CellType::vector) {
      for (std::size_t r = 0; r < table.rows.size(); ++r) {  // name the first offender
        csv_number(table.rows[r][c], "data file '" + path + "', row " + std::to_string(r + 1) +
                                         ", column '" + table.columns[c] + "'");
      }
    }
    types.emplace_back(cell_type_name(t));
  }
  return read_csv_shard(path, types);
}

// This rank's shard, from KOLO_DATA_FILE and KOLO_DATA_FORMAT (default: the file's suffix);
// CSV columns typed by KOLO_DATA_TYPES when set; the row count checked against KOLO_DATA_ROWS.
inline DataShard load_data_shard(const EnvLookup& env = process_env()) {
  const auto path = config::get_text(env, config::vars::data_file);
  if (!path || path->empty()) {
    throw ConfigError(
        "KOLO_DATA_FILE is not set: start the program with kolo_spark.run(..., df=DataFrame)");
  }
  // Unset or empty: the file's suffix. A value not declared is the table's ConfigError
  // ("KOLO_DATA_FORMAT=parquet is not csv, f64 or bin").
  const ShardFormat format = config::get_choice<ShardFormat>(env, config::vars::data_format)
                                 .value_or(path->ends_with(".f64")   ? ShardFormat::f64
                                           : path->ends_with(".bin") ? ShardFormat::bin
                                                                     : ShardFormat::csv);
  std::vector<std::string> names;
  if (auto c = config::get_text(env, config::vars::data_columns)) names = detail::split_commas(*c);
  DataShard shard;
  if (format == ShardFormat::f64) {
    shard = read_f64(*path);
    // A column name holding a comma makes the list ambiguous: then the names stay c0, c1, ...
    if (names.size() == shard.cols()) {
      for (std::size_t i = 0; i < names.size(); ++i) shard.fields[i].name = names[i];
      detail::layout(shard);
    }
  } else if (format == ShardFormat::bin) {
    shard = read_bin(*path);
  } else {
    std::vector<std::string> types;
    if (auto t = config::get_text(env, config::vars::data_types)) types = detail::split_commas(*t);
    shard = read_csv_shard(*path, types);
  }
  if (auto expect = config::get_int(env, config::vars::data_rows)) {
    if (*expect != static_cast<long long>(shard.rows)) {
      throw ConfigError("KOLO_DATA_ROWS=" + std::to_string(*expect) + " but data file '" + *path +
                        "' holds " + std::to_string(shard.rows) + " rows");
    }
  }
  return shard;
}

}  // namespace kolo::spark
