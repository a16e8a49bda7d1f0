#!/usr/bin/env python3
"""Where a CUDA kernel's time goes, barrier to barrier: writes an instrumented copy of a .cu file.

In each named __global__ kernel, thread 0 of every block reads clock64() before and after each
statement-level `__syncthreads();` of the kernel's own body (not those inside the functions it
calls) and adds the differences to per-kernel, per-point sums in global memory. At exit the
program prints, per kernel, the average cycles per pass of each point: "work" up to barrier i (the
segment thread 0 spent since the point before) and "wait" at barrier i (how long it waited there
for the other warps), with the barrier's line in the original file. Points inside a loop over
chunks are averaged per pass, so their averages are per chunk; a segment before the loop counts
once per block.

The numbers are thread 0's: where its wait at a barrier is small, its segments are the block's
critical path. The instrumentation adds one atomic per point and thread 0, and a chain of
clock64() reads; compare the total against the kernel's time before trusting shares.

    python3 tools/trace_barriers.py --in-place src/ops/delta_rule/delta_rule_chunked_cuda.cu \\
        grad_s_kernel state_s_kernel dstate_s_kernel prep_s_kernel
    cmake --build build-gpu --target cuda_tests      # (then `git checkout` the file)
    LRNN_TRACE_BARRIERS=1 build-gpu/tests/cuda_tests ...   # the table goes to stderr at exit

Without LRNN_TRACE_BARRIERS set the instrumented binary prints nothing.
"""
import argparse
import re
import sys

PRELUDE = r'''
// ---- inserted by tools/trace_barriers.py (not for committing) ----
#include <cstdio>
#include <cstdlib>
#define LRNN_TRACE_KERNELS {NK}
#define LRNN_TRACE_POINTS {NP}
__device__ unsigned long long lrnn_trace_sum[LRNN_TRACE_KERNELS][LRNN_TRACE_POINTS];
__device__ unsigned long long lrnn_trace_n[LRNN_TRACE_KERNELS][LRNN_TRACE_POINTS];
struct LrnnTrace {
  int k;
  long long t;
  __device__ explicit LrnnTrace(int k_) : k(k_), t(0) {
#ifdef __CUDA_ARCH__
    t = clock64();
#endif
  }
  __device__ void operator()(int i) {
#ifdef __CUDA_ARCH__
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
      const long long n = clock64();
      atomicAdd(&lrnn_trace_sum[k][i], (unsigned long long)(n - t));
      atomicAdd(&lrnn_trace_n[k][i], 1ull);
      t = n;
    }
#endif
  }
};
static const char* lrnn_trace_names[LRNN_TRACE_KERNELS] = {{{NAMES}}};
static const int lrnn_trace_lines[LRNN_TRACE_KERNELS][LRNN_TRACE_POINTS / 2] = {{{LINES}}};
static void lrnn_trace_print() {
  static unsigned long long sum[LRNN_TRACE_KERNELS][LRNN_TRACE_POINTS], n[LRNN_TRACE_KERNELS][LRNN_TRACE_POINTS];
  if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpyFromSymbol(sum, lrnn_trace_sum, sizeof sum) != cudaSuccess ||
      cudaMemcpyFromSymbol(n, lrnn_trace_n, sizeof n) != cudaSuccess) {
    std::fprintf(stderr, "trace_barriers: could not read the sums\n");
    return;
  }
  for (int k = 0; k < LRNN_TRACE_KERNELS; ++k) {
    double total = 0;
    for (int i = 0; i < LRNN_TRACE_POINTS; ++i)
      if (n[k][i]) total += double(sum[k][i]) / double(n[k][i]);
    if (total == 0) continue;
    std::fprintf(stderr, "trace_barriers %s: cycles per pass (thread 0), %.0f in all\n", lrnn_trace_names[k], total);
    for (int i = 0; i < LRNN_TRACE_POINTS; ++i) {
      if (!n[k][i]) continue;
      const double c = double(sum[k][i]) / double(n[k][i]);
      std::fprintf(stderr, "  %s barrier %2d (line %5d): %9.0f  %5.1f %%  (%llu passes)\n", i % 2 ? "wait at" : "work to",
                   i / 2, lrnn_trace_lines[k][i / 2], c, 100.0 * c / total, n[k][i]);
    }
  }
}
static void lrnn_trace_register() {
  // After the runtime's own set-up (the first launch), so that this runs before its teardown.
  static const bool once = [] {
    if (std::getenv("LRNN_TRACE_BARRIERS")) std::atexit(lrnn_trace_print);
    return true;
  }();
  (void)once;
}
// ---- end of inserted prelude ----
'''


def kernel_body(src, name):
    """(start, end) of the body of __global__ kernel `name` (inside its braces)."""
    m = re.search(r'__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?' + re.escape(name) + r'\s*\(', src)
    if not m:
        sys.exit(f"trace_barriers: no __global__ kernel named {name}")
    i = src.index('{', m.end())
    depth, j = 0, i
    while True:
        ch = src[j]
        if ch == '{':
            depth += 1
        elif ch == '}':
            depth -= 1
            if depth == 0:
                return i + 1, j
        j += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('file')
    ap.add_argument('kernels', nargs='+')
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument('-o', '--out')
    g.add_argument('--in-place', action='store_true')
    a = ap.parse_args()
    src = open(a.file).read()
    if 'inserted by tools/trace_barriers.py' in src:
        sys.exit("trace_barriers: the file is instrumented already")
    lines_of = []
    # Instrument from the last kernel in the file to the first, so earlier offsets stay valid.
    spans = sorted(((kernel_body(src, k), ki, k) for ki, k in enumerate(a.kernels)), reverse=True)
    bodies = {}
    for (b0, b1), ki, k in spans:
        body = src[b0:b1]
        first_line = src.count('\n', 0, b0) + 1
        points, lines = [0], []

        def wrap(m):
            i = points[0]
            points[0] += 2
            lines.append(first_line + body.count('\n', 0, m.start()))
            return f'{m.group(1)}lrnn_tr_({i}); __syncthreads(); lrnn_tr_({i + 1});'

        new = re.sub(r'^([ \t]*)__syncthreads\(\);', wrap, body, flags=re.M)
        if not lines:
            print(f"trace_barriers: {k} has no statement-level __syncthreads()", file=sys.stderr)
        bodies[ki] = lines
        src = src[:b0] + f'\n  LrnnTrace lrnn_tr_({ki});' + new + src[b1:]
    # Every host launch registers the report (the first one after the runtime is set up).
    src = re.sub(r'^([ \t]*)([^\n]*<<<)', r'\1lrnn_trace_register();\n\1\2', src, flags=re.M)
    npoints = max(2, 2 * max(len(v) for v in bodies.values()))
    lines_init = ', '.join('{' + ', '.join(str(x) for x in (bodies[i] or [0])) + '}' for i in range(len(a.kernels)))
    prelude = (PRELUDE.replace('{NK}', str(len(a.kernels))).replace('{NP}', str(npoints))
               .replace('{{{NAMES}}}', '{' + ', '.join(f'"{k}"' for k in a.kernels) + '}')
               .replace('{{{LINES}}}', '{' + lines_init + '}'))
    # The prelude after the last #include at file scope.
    inc = list(re.finditer(r'^#include[^\n]*\n', src, flags=re.M))
    at = inc[-1].end() if inc else 0
    src = src[:at] + prelude + src[at:]
    open(a.file if a.in_place else a.out, 'w').write(src)
    for ki, k in enumerate(a.kernels):
        print(f"{k}: {len(bodies[ki])} barriers traced (lines {', '.join(map(str, bodies[ki]))})", file=sys.stderr)


if __name__ == '__main__':
    main()
