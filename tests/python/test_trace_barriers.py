"""tools/trace_barriers.py: the instrumented copy of a .cu file it writes.

Runs the tool on a small CUDA source (two kernels, a device function with a barrier of its own, a
barrier inside a lambda, nested braces, a host launch) and checks the text it writes: the prelude
after the last #include, a tracer at the top of each named kernel, every statement-level barrier
of those kernels (and only those) wrapped by two trace points numbered in order, the barriers'
source lines in the report's table, the report registered before each launch, and the refusals
(an unknown kernel, a file instrumented already). Whether the result compiles and runs is checked
on a GPU machine (see the tool's docstring); this test needs no CUDA.

Environment (set by ctest): LRNN_SOURCE_DIR (the repository).
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

REPO = os.environ.get("LRNN_SOURCE_DIR") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(REPO, "tools", "trace_barriers.py")

SOURCE = """#include <cstdio>
#include <cuda_runtime.h>
namespace demo {
__device__ void helper(float* x) {
  x[threadIdx.x] = 1.f;
  __syncthreads();
}
template <int N>
__global__ void __launch_bounds__(256) first_kernel(float* x) {
  if (threadIdx.x < N) {
    x[threadIdx.x] = 0.f;
  }
  __syncthreads();
  for (int i = 0; i < 4; ++i) {
    helper(x);
    __syncthreads();
  }
  auto fold = [&]() {
    __syncthreads();
  };
  fold();
}
__global__ void second_kernel(float* x) {
  { x[0] = 1.f; }
  __syncthreads();
}
__global__ void untouched_kernel(float* x) {
  __syncthreads();
}
}  // namespace demo
void run(float* x) {
  demo::first_kernel<64><<<1, 256>>>(x);
  demo::second_kernel<<<1, 32>>>(x);
}
"""


def run_tool(path, *args):
    return subprocess.run([sys.executable, TOOL, path, *args], capture_output=True, text=True)


class TraceBarriers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.src = os.path.join(self.dir.name, "demo.cu")
        with open(self.src, "w") as f:
            f.write(SOURCE)

    def tearDown(self):
        self.dir.cleanup()

    def instrument(self, *kernels):
        out = os.path.join(self.dir.name, "out.cu")
        r = run_tool(self.src, *kernels, "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            return f.read(), r.stderr

    def body(self, text, name):
        m = re.search(r"__global__ void (?:__launch_bounds__\(\d+\) )?" + name + r"\(", text)
        self.assertIsNotNone(m, name)
        i, depth = text.index("{", m.end()), 0
        for j in range(i, len(text)):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            if depth == 0:
                return text[i:j + 1]
        self.fail("unbalanced braces")

    def test_kernels_barriers_and_report(self):
        text, err = self.instrument("first_kernel", "second_kernel")
        # The prelude after the last #include, before the namespace.
        self.assertLess(text.index("#include <cuda_runtime.h>"), text.index("inserted by tools/trace_barriers.py"))
        self.assertLess(text.index("end of inserted prelude"), text.index("namespace demo"))
        self.assertIn("#define LRNN_TRACE_KERNELS 2", text)
        # first_kernel: its three statement-level barriers (the loop's and the lambda's included)
        # wrapped 0/1, 2/3, 4/5; the tracer declared at its top.
        first = self.body(text, "first_kernel")
        self.assertTrue(first.startswith("{\n  LrnnTrace lrnn_tr_(0);"), first[:60])
        wrapped = re.findall(r"lrnn_tr_\((\d+)\); __syncthreads\(\); lrnn_tr_\((\d+)\);", first)
        self.assertEqual(wrapped, [("0", "1"), ("2", "3"), ("4", "5")])
        self.assertEqual(first.count("__syncthreads()"), 3)
        second = self.body(text, "second_kernel")
        self.assertIn("LrnnTrace lrnn_tr_(1);", second)
        self.assertEqual(re.findall(r"lrnn_tr_\((\d+)\); __syncthreads\(\); lrnn_tr_\((\d+)\);", second), [("0", "1")])
        # Neither the device function nor the kernel not named is touched.
        helper = text[text.index("__device__ void helper"):text.index("template <int N>")]
        self.assertNotIn("lrnn_tr_", helper)
        self.assertNotIn("lrnn_tr_", self.body(text, "untouched_kernel"))
        # The report's names and the barriers' lines in the original file (13, 16, 19; 25).
        self.assertIn('{"first_kernel", "second_kernel"}', text)
        self.assertIn("{{13, 16, 19}, {25}}", text)
        self.assertIn("#define LRNN_TRACE_POINTS 6", text)
        self.assertIn("first_kernel: 3 barriers traced (lines 13, 16, 19)", err)
        # Registered before each launch, with its indentation.
        self.assertEqual(text.count("lrnn_trace_register();\n  demo::"), 2)

    def test_in_place_and_refusals(self):
        r = run_tool(self.src, "no_such_kernel", "--in-place")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no __global__ kernel named no_such_kernel", r.stderr + r.stdout)
        with open(self.src) as f:
            self.assertEqual(f.read(), SOURCE)  # a refused call writes nothing
        r = run_tool(self.src, "second_kernel", "--in-place")
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(self.src) as f:
            self.assertIn("LrnnTrace lrnn_tr_(0);", f.read())
        r = run_tool(self.src, "second_kernel", "--in-place")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("instrumented already", r.stderr + r.stdout)


if __name__ == "__main__":
    unittest.main()
