// kolo/spark/spark_config.hpp — the Spark backend's variables: the data shard a rank reads
// (KOLO_DATA_*, exported by kolo_spark.run(..., df=...), read by data_file.hpp; the format as
// ShardFormat) and the ones kolo_spark sets for its own function ranks (KOLO_SPARK_*, read by
// Python). How a variable is declared and read: kolo/core/config_var.hpp.
#pragma once

#include <cstdint>

#include "kolo/core/config_var.hpp"

namespace kolo::spark {

// The layout of a shard file (KOLO_DATA_FORMAT).
enum class ShardFormat : std::uint8_t { csv, f64, bin };

}  // namespace kolo::spark

namespace kolo::config {

inline constexpr Choice kShardFormats[] = {choice(spark::ShardFormat::csv, "csv"),
                                           choice(spark::ShardFormat::f64, "f64"),
                                           choice(spark::ShardFormat::bin, "bin")};
inline constexpr Choices kShardFormatChoices{kShardFormats, false, false, ListStyle::either};

namespace vars {

// ---- Spark data shards (exported by kolo_spark.run(..., df=...)) ----
inline constexpr Var data_file{"KOLO_DATA_FILE",
                               Kind::text,
                               Section::spark,
                               Reader::spark_data,
                               0,
                               0,
                               "-",
                               "path of this rank's DataFrame shard"};
inline constexpr Var data_format{"KOLO_DATA_FORMAT",
                                 Kind::choice,
                                 Section::spark,
                                 Reader::spark_data,
                                 0,
                                 0,
                                 "the file's suffix",
                                 "layout of the shard",
                                 {},
                                 &kShardFormatChoices,
                                 true};
inline constexpr Var data_rows{"KOLO_DATA_ROWS",
                               Kind::integer,
                               Section::spark,
                               Reader::spark_data,
                               0,
                               1ll << 53,
                               "-",
                               "rows in the shard (checked against the file)"};
inline constexpr Var data_columns{"KOLO_DATA_COLUMNS",
                                  Kind::text,
                                  Section::spark,
                                  Reader::spark_data,
                                  0,
                                  0,
                                  "-",
                                  "comma-separated column names of the shard",
                                  {},
                                  {},
                                  true};
inline constexpr Var data_types{"KOLO_DATA_TYPES",
                                Kind::text,
                                Section::spark,
                                Reader::spark_data,
                                0,
                                0,
                                "inferred from the cells",
                                "comma-separated types of a csv shard's columns (`float64`, "
                                "`int64`, `string`, `vector:N`)",
                                {},
                                {},
                                true};

// ---- set by kolo_spark for its function ranks (removed from the environment on start) ----
inline constexpr Var spark_fn{"KOLO_SPARK_FN",
                              Kind::text,
                              Section::internal,
                              Reader::none,
                              0,
                              0,
                              "-",
                              "path of the pickled function a function rank runs"};
inline constexpr Var spark_result{"KOLO_SPARK_RESULT",
                                  Kind::text,
                                  Section::internal,
                                  Reader::none,
                                  0,
                                  0,
                                  "-",
                                  "where a function rank writes its pickled return value"};
inline constexpr Var spark_max_result{
    "KOLO_SPARK_MAX_RESULT",
    Kind::text,
    Section::internal,
    Reader::none,
    0,
    0,
    "-",
    "the largest return value, in bytes, a function rank may send"};
inline constexpr Var spark_pickler{"KOLO_SPARK_PICKLER",
                                   Kind::text,
                                   Section::internal,
                                   Reader::none,
                                   0,
                                   0,
                                   "-",
                                   "the module the driver pickled the function with"};
inline constexpr Var spark_trace{"KOLO_SPARK_TRACE",
                                 Kind::text,
                                 Section::internal,
                                 Reader::none,
                                 0,
                                 0,
                                 "-",
                                 "where a function rank writes its timeline events"};
inline constexpr Var spark_launched{"KOLO_SPARK_LAUNCHED",
                                    Kind::text,
                                    Section::internal,
                                    Reader::none,
                                    0,
                                    0,
                                    "-",
                                    "when the task launched the rank (for the timeline)"};

// ---- Elastic and retried runs (exported by kolo_spark.run(..., elastic=True or
// max_attempts > 1) beside KOLO_STORE and KOLO_JOB_ID; read by kolo_spark.elastic) ----
inline constexpr Var spark_elastic{"KOLO_SPARK_ELASTIC",
                                   Kind::integer,
                                   Section::spark,
                                   Reader::none,
                                   0,
                                   1,
                                   "0",
                                   "`1`: a lost rank does not end the run (`elastic=True`)"};
inline constexpr Var spark_min_np{"KOLO_SPARK_MIN_NP",
                                  Kind::integer,
                                  Section::spark,
                                  Reader::none,
                                  0,
                                  1ll << 31,
                                  "0",
                                  "the run's `min_np`: with fewer ranks left the driver ends it"};
inline constexpr Var spark_attempt{"KOLO_SPARK_ATTEMPT",
                                   Kind::integer,
                                   Section::spark,
                                   Reader::none,
                                   0,
                                   1ll << 31,
                                   "0",
                                   "this attempt's number: 0, then 1 for the first retry, ..."};

}  // namespace vars

// The Spark backend's variables: the data shard's, then the internal ones.
inline constexpr const Var* kSparkDataVars[] = {
    &vars::data_file,  &vars::data_format,   &vars::data_rows,    &vars::data_columns,
    &vars::data_types, &vars::spark_elastic, &vars::spark_min_np, &vars::spark_attempt};
inline constexpr const Var* kSparkInternalVars[] = {&vars::spark_fn,         &vars::spark_result,
                                                    &vars::spark_max_result, &vars::spark_pickler,
                                                    &vars::spark_trace,      &vars::spark_launched};

}  // namespace kolo::config
