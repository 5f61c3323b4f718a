#!/usr/bin/env bash
# Compile time of kolo for a user, header-only (kolo::kolo) vs the compiled core (kolo::kolo_lib):
# docs/performance.md "Compile time" comes from this script.
#
#   benchmarks/compile_time.sh [BUILD_DIR] [REPEATS] [BASE_TREE BASE_BUILD_DIR]
#
# BUILD_DIR is a configured kolo build in which the target kolo_lib is built (libkolo.a under
# src/lib; default: build). Three user files, as a user writes them:
#   a  an empty main() including <kolo/kolo.hpp>
#   b  the README's snippet: a Communicator<>, an allreduce and a broadcast
#   c  b plus an Engine<> and one allreduce_async
# each compiled and linked at -O2 (CXX, default g++) header-only and with -DKOLO_COMPILED_CORE +
# libkolo.a, interleaved (a/header-only, a/core, b/header-only, ... then again) REPEATS times
# (default 3). Prints per case the median and the worst wall time and the median CPU time
# (user + sys), the load before and after, the `-H` include counts of <kolo/kolo.hpp>, and the
# size of the b program linked statically (-static) both ways, stripped.
#
# PCH=1 in the environment adds two modes, header-only+pch and core+pch: <kolo/kolo.hpp> and
# <kolo/engine/engine.hpp> precompiled once per mode (g++ -x c++-header, the same flags; the
# one-time cost is printed) and each file compiled with -include of it, as CMake's
# target_precompile_headers does.
#
# With BASE_TREE and BASE_BUILD_DIR (another checkout, e.g. the previous commit, and its build
# with kolo_lib built), the same cases of that tree run interleaved with this one's, in the same
# run: the "before" and "after" of a change, with the same load.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-build}"
repeats="${2:-3}"
base_tree="${3:-}"
base_build="${4:-}"
[[ "$build" = /* ]] || build="$here/$build"
lib="$build/src/lib/libkolo.a"
for l in "$lib" ${base_build:+"$base_build/src/lib/libkolo.a"}; do
  if [[ ! -f "$l" ]]; then
    echo "compile_time.sh: $l not found: build the target kolo_lib first" \
         "(cmake --build $(dirname "$(dirname "$(dirname "$l")")") --target kolo_lib)" >&2
    exit 2
  fi
done
if [[ -n "$base_tree" && -z "$base_build" ]]; then
  echo "compile_time.sh: BASE_TREE needs BASE_BUILD_DIR" >&2
  exit 2
fi
cxx="${CXX:-g++}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cat > "$work/a.cpp" <<'CPP'
#include <kolo/kolo.hpp>
int main() { return 0; }
CPP
cat > "$work/b.cpp" <<'CPP'
#include <kolo/kolo.hpp>
int main() {
  auto comm = kolo::Communicator<>::from_env();
  std::vector<float> grad(1 << 20, 1.0f);
  comm.allreduce(std::span<float>(grad), kolo::ReduceOp::average);
  comm.broadcast(std::span<float>(grad), 0);
}
CPP
cat > "$work/c.cpp" <<'CPP'
#include <kolo/engine/engine.hpp>
#include <kolo/kolo.hpp>
int main() {
  auto comm = kolo::Communicator<>::from_env();
  std::vector<float> grad(1 << 20, 1.0f);
  comm.allreduce(std::span<float>(grad), kolo::ReduceOp::average);
  comm.broadcast(std::span<float>(grad), 0);
  kolo::Engine<> engine(std::move(comm));
  auto h = engine.allreduce_async("fc1.weight", kolo::TensorView(std::span<float>(grad)),
                                  kolo::ReduceOp::average);
  h.wait();
}
CPP

inc=(-I"$here/include" -I"$here/backends/spark/include")
base_inc=()
[[ -z "$base_tree" ]] || base_inc=(-I"$base_tree/include" -I"$base_tree/backends/spark/include")
modes=(header-only core)
[[ -z "$base_tree" ]] || modes=(base-header-only base-core header-only core)
[[ "${PCH:-0}" != 1 ]] || modes+=(header-only+pch core+pch)
flags=(-std=c++20 -O2 -DNDEBUG)
libs=(-lcrypto -pthread -lrt)
mode_flags() {
  if [[ "${1%+pch}" == *core ]]; then echo "-DKOLO_COMPILED_CORE"; fi
  # -Winvalid-pch as an error: a precompiled header that cannot be used fails the run instead
  # of being parsed silently.
  if [[ "$1" == *+pch ]]; then echo "-Winvalid-pch -Werror=invalid-pch -include $work/pch-$1/kolo_pch.hpp"; fi
}
mode_libs() {
  if [[ "${1%+pch}" == core ]]; then echo "$lib"; fi
  if [[ "$1" == base-core ]]; then echo "$base_build/src/lib/libkolo.a"; fi
}
mode_inc() { if [[ "$1" == base-* ]]; then echo "${base_inc[@]}"; else echo "${inc[@]}"; fi; }

echo "compiler: $("$cxx" --version | head -1)"
for mode in "${modes[@]}"; do
  [[ "$mode" == *+pch ]] || continue
  mkdir -p "$work/pch-$mode"
  printf '#include <kolo/kolo.hpp>\n#include <kolo/engine/engine.hpp>\n' > "$work/pch-$mode/kolo_pch.hpp"
  core_flag=""
  [[ "${mode%+pch}" != core ]] || core_flag="-DKOLO_COMPILED_CORE"
  # shellcheck disable=SC2086
  /usr/bin/time -f "%e %U %S" -o "$work/t" "$cxx" "${flags[@]}" "${inc[@]}" $core_flag \
    -pthread -x c++-header "$work/pch-$mode/kolo_pch.hpp" -o "$work/pch-$mode/kolo_pch.hpp.gch"
  read -r w u s < "$work/t"
  echo "precompiling the header ($mode, once): ${w} s wall, $(python3 -c "print(f'{$u + $s:.2f}')") s CPU," \
       "$(stat -c %s "$work/pch-$mode/kolo_pch.hpp.gch") bytes"
done
echo "cpus: $(nproc); load before: $(cut -d' ' -f1-3 /proc/loadavg)"
results="$work/results.txt"
: > "$results"
for ((i = 1; i <= repeats; ++i)); do
  for f in a b c; do
    for mode in "${modes[@]}"; do
      # shellcheck disable=SC2046
      /usr/bin/time -f "$f $mode %e %U %S" -o "$work/t" "$cxx" "${flags[@]}" $(mode_inc "$mode") \
        $(mode_flags "$mode") "$work/$f.cpp" -o "$work/$f-$mode" $(mode_libs "$mode") "${libs[@]}"
      cat "$work/t" >> "$results"
    done
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo
python3 - "$results" "$repeats" "${modes[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
modes = sys.argv[3:]
names = {"a": "empty file + <kolo/kolo.hpp>", "b": "allreduce + broadcast",
         "c": "allreduce + broadcast + Engine"}
title = {"header-only": "header-only", "core": "compiled core",
         "header-only+pch": "header-only + PCH", "core+pch": "compiled core + PCH",
         "base-header-only": "base header-only", "base-core": "base compiled core"}
print(f"compile + link at -O2, {sys.argv[2]} runs each (wall s: median / worst; cpu s: median)")
print("| file | " + " | ".join(f"{title[m]} wall" for m in modes) + " | " +
      " | ".join(f"{title[m]} cpu" for m in modes) + " |")
print("| --- " * (1 + 2 * len(modes)) + "|")
for f in "abc":
    cells = []
    for kind in ("wall", "cpu"):
        for mode in modes:
            rs = [r for r in rows if r[0] == f and r[1] == mode]
            wall = [float(r[2]) for r in rs]
            cpu = [float(r[3]) + float(r[4]) for r in rs]
            if kind == "wall":
                cells.append(f"{statistics.median(wall):.2f} / {max(wall):.2f}")
            else:
                cells.append(f"{statistics.median(cpu):.2f}")
    print(f"| {names[f]} | " + " | ".join(cells) + " |")
PY
echo
hcount() {
  # shellcheck disable=SC2046
  "$cxx" "${flags[@]}" $(mode_inc "$1") $(mode_flags "$1") -H -fsyntax-only "$work/a.cpp" 2>&1 |
    grep -c '^\.'
}
lines() {
  # shellcheck disable=SC2046
  "$cxx" "${flags[@]}" $(mode_inc "$1") $(mode_flags "$1") -E "$work/a.cpp" | wc -l
}
if [[ -n "$base_tree" ]]; then
  echo "<kolo/kolo.hpp> (base): header-only $(hcount base-header-only) includes," \
       "$(lines base-header-only) lines preprocessed; compiled core $(hcount base-core)" \
       "includes, $(lines base-core) lines"
fi
echo "<kolo/kolo.hpp>: header-only $(hcount header-only) includes, $(lines header-only) lines" \
     "preprocessed; compiled core $(hcount core) includes, $(lines core) lines"
echo
for mode in header-only core; do
  # shellcheck disable=SC2046
  if "$cxx" "${flags[@]}" "${inc[@]}" $(mode_flags $mode) -static "$work/b.cpp" \
       -o "$work/b-static-$mode" $(mode_libs $mode) "${libs[@]}" -ldl 2> "$work/static.log"; then
    strip -o "$work/b-static-$mode.stripped" "$work/b-static-$mode"
    echo "b linked -static ($mode): $(stat -c %s "$work/b-static-$mode") bytes," \
         "$(stat -c %s "$work/b-static-$mode.stripped") stripped"
  else
    echo "b linked -static ($mode): failed (a static libcrypto is needed):"
    head -5 "$work/static.log"
  fi
done
