#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer (cmake --preset debug: g++,
# -O1, no CUDA): every test but the long learning ones. Any sanitizer report fails the test that
# triggered it (UBSan does not recover; ASan and LeakSanitizer abort).
#   scripts/sanitize.sh              # make test runs this
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset debug > build-debug.log 2>&1 || { cat build-debug.log; exit 1; }
cmake --build build-debug -j "$(nproc)" >> build-debug.log 2>&1 || { tail -50 build-debug.log; exit 1; }
cd build-debug
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  OMP_WAIT_POLICY=passive ctest --output-on-failure -j "$(nproc)" --timeout 900 -E 'Learning'
