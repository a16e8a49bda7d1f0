#!/usr/bin/env bash
# Fuzzes every reader: builds the libFuzzer targets (cmake --preset fuzz: clang, ASan + UBSan,
# coverage) and runs each for SECONDS (default 20) on the committed seed corpus (fuzz/corpus/<name>)
# plus fresh mutations. Fails on a crash, a sanitizer report, an input that takes longer than 10 s
# (a hang), more than 2 GB resident or a single allocation over 1 GB.
#   scripts/fuzz.sh            # make test runs this
#   scripts/fuzz.sh 3600       # an hour per target
#   scripts/fuzz.sh 60 fuzz_safetensors
# Environment:
#   FUZZ_WORKERS=N     N processes per target sharing one corpus (libFuzzer reloads what the
#                      others found); executions are summed, coverage is the largest seen
#   FUZZ_PARALLEL=1    all targets at once (a machine with cores to spare) instead of one by one
#   FUZZ_PREBUILT=1    skip the build: run the binaries already in build-fuzz/fuzz (carried to a
#                      machine without clang)
# New corpus entries go to build-fuzz/corpus/<name> (kept between runs, never committed); a
# finding is written to build-fuzz/artifacts/<name>/ and its path printed.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-20}
only=${2:-}
workers=${FUZZ_WORKERS:-1}
if [ "${FUZZ_PREBUILT:-0}" != 1 ]; then
  cmake --preset fuzz > build-fuzz.log 2>&1 || { cat build-fuzz.log; exit 1; }
  cmake --build build-fuzz -j "$(nproc)" >> build-fuzz.log 2>&1 || { tail -50 build-fuzz.log; exit 1; }
fi

# fuzz_one NAME: runs the target's workers, prints one line, returns 1 on a finding.
fuzz_one() {
  local name=$1 bin=build-fuzz/fuzz/$1
  local seeds=fuzz/corpus/${name#fuzz_} work=build-fuzz/corpus/${name#fuzz_} art=build-fuzz/artifacts/${name#fuzz_}
  mkdir -p "$work" "$art"
  local pids=() failed=0 w
  for ((w = 0; w < workers; ++w)); do
    # LeakSanitizer stays on; each target limits the memory a fuzzed config may plan for itself.
    "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
      -print_final_stats=1 -artifact_prefix="$art/" "$work" "$seeds" > "build-fuzz/$name.$w.log" 2>&1 &
    pids+=($!)
  done
  for w in "${pids[@]}"; do wait "$w" || failed=1; done
  if [ $failed = 0 ]; then
    local execs cov
    execs=$(cat build-fuzz/"$name".*.log | grep -o 'stat::number_of_executed_units: *[0-9]*' |
            awk '{s += $2} END {print s + 0}')
    cov=$(cat build-fuzz/"$name".*.log | grep -o 'cov: [0-9]*' | awk '$2 > m {m = $2} END {print m + 0}')
    echo "fuzz: $name: ${seconds} s x $workers worker(s), $execs inputs, cov: $cov, corpus $(ls "$work" | wc -l) files, no finding"
  else
    echo "fuzz: $name: FINDING (logs build-fuzz/$name.*.log, input in $art/):"
    cat build-fuzz/"$name".*.log | grep -E 'ERROR|SUMMARY|==[0-9]+==|Test unit written' | head -20
    return 1
  fi
}

status=0
pids=()
for bin in build-fuzz/fuzz/fuzz_*; do
  name=$(basename "$bin")
  [ -n "$only" ] && [ "$name" != "$only" ] && continue
  if [ "${FUZZ_PARALLEL:-0}" = 1 ]; then
    fuzz_one "$name" & pids+=($!)
  else
    fuzz_one "$name" || status=1
  fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
