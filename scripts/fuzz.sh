#!/usr/bin/env bash
# Fuzzes every reader: builds the libFuzzer targets (cmake --preset fuzz: clang, ASan + UBSan,
# coverage) and runs each for SECONDS (default 20) on the committed seed corpus (fuzz/corpus/<name>)
# plus fresh mutations. Fails on a crash, a sanitizer report, an input that takes longer than 10 s
# (a hang), more than 2 GB resident or a single allocation over 1 GB.
#   scripts/fuzz.sh            # make test runs this
#   scripts/fuzz.sh 3600       # an hour per target
#   scripts/fuzz.sh 60 fuzz_safetensors
# New corpus entries go to build-fuzz/corpus/<name> (kept between runs, never committed); a
# finding is written to build-fuzz/artifacts/<name>/ and its path printed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
only=${2:-}
cmake --preset fuzz > build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
cmake --build build-fuzz -j "$(nproc)" >> build-fuzz.log 2>&1 || { tail -50 build-fuzz.log; exit 1; }
status=0
for bin in build-fuzz/fuzz/fuzz_*; do
  name=$(basename "$bin")
  [ -n "$only" ] && [ "$name" != "$only" ] && continue
  seeds=fuzz/corpus/${name#fuzz_}
  work=build-fuzz/corpus/${name#fuzz_}
  art=build-fuzz/artifacts/${name#fuzz_}
  mkdir -p "$work" "$art"
  log=build-fuzz/$name.log
  # LeakSanitizer stays on; each target limits the memory a fuzzed config may plan for itself.
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
       -print_final_stats=1 -artifact_prefix="$art/" "$work" "$seeds" > "$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "fuzz: $name: ${seconds} s, $execs inputs, $cov, no finding"
  else
    status=1
    echo "fuzz: $name: FINDING (log $log, input in $art/):"
    grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written' "$log" | head -20
  fi
done
exit $status
