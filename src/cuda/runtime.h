// The CUDA runtime as lrnn uses it: one device, one stream that every op launches on (so a step
// can be captured as a CUDA graph), one cuBLAS handle, error checks that name the call and the
// place, owning device buffers, and a small scratch area for reductions inside one op call.
//
// Only compiled with LRNN_CUDA (LRNN_WITH_CUDA defined). Everything here is host code: op
// kernels live in ops/<op>/<op>_cuda.cu and launch on `stream()`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <cuda_runtime.h>

namespace lrnn::cuda {

// Throws lrnn::Error naming the call, the CUDA error and file:line.
[[noreturn]] void fail(cudaError_t e, const char* what, const char* file, int line);
#define LRNN_CUDA_CHECK(x)                                                   \
  do {                                                                       \
    cudaError_t lrnn_e_ = (x);                                               \
    if (lrnn_e_ != cudaSuccess) ::lrnn::cuda::fail(lrnn_e_, #x, __FILE__, __LINE__); \
  } while (0)
// After a kernel launch: catches bad launch configurations at once (not asynchronous faults).
#define LRNN_CUDA_LAUNCH_CHECK() LRNN_CUDA_CHECK(cudaGetLastError())

// True when a CUDA device can be used (false without a driver or GPU: tests skip then).
bool available();
// The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies); 0 without a driver or GPU.
int device_count();
// Makes device `index` (modulo the devices this process sees) the current one: call it before
// any other CUDA work (one process per GPU, dist/): the stream, cuBLAS handles and scratch are
// made on the device that is current when they are first used. Returns the device chosen.
int select_device(int index);
// A one-line description of the current device ("NVIDIA H200, sm_90, 132 SMs, 140 GiB").
std::string device_name();
// The CUDA driver and runtime versions as "13.0" (for a run's provenance).
std::string driver_version();
std::string runtime_version();
// Streaming multiprocessors of the current device (queried once).
int num_sms();
// The most shared memory one block may opt in to, in bytes (queried once).
int max_smem_optin();
// The most dynamic shared memory a launch of `kernel` may ask for: max_smem_optin() less the
// kernel's static __shared__ arrays (asking for more than that fails with "invalid argument").
size_t max_dynamic_smem(const void* kernel);
// Opts `kernel` in to max_dynamic_smem(kernel). Call once per kernel, before a graph capture
// that launches it (the kernels keep a static flag).
void allow_max_dynamic_smem(const void* kernel);
// The stream every lrnn op launches on (created on first use): the main stream, or the side
// stream between fork() and unfork().
cudaStream_t stream();
// Waits for everything on both streams; rethrows asynchronous kernel faults.
void synchronize();

// Overlap inside a step: work whose results the main stream's next ops do not need (weight
// gradients) can run on a second stream, next to latency-bound kernels such as the delta rule.
//   fork()      the side stream waits for everything queued on the main stream so far; until
//               unfork(), stream() and cublas() are the side stream's (ops launch there)
//   unfork()    back to the main stream; returns a ticket for the side work queued so far
//   wait(t)     the main stream waits for ticket t (before it overwrites what that work reads)
//   join()      the main stream waits for all side work (before a step ends)
// Both directions are event dependencies, so a captured CUDA graph keeps them as edges. The
// side stream must not use scratch() (one buffer, ordered on the main stream only).
void fork();
int unfork();
void wait(int ticket);
void join();

// Matrix products: TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation), full fp32 (for
// tight comparisons against the CPU reference), or BF16: TF32 as before, and the models that
// support it (the delta-rule family: DeltaNet, Gated DeltaNet, DeltaProduct) run every projection
// (the mixer's in and out, the MLP, the LM head) as a bf16 GEMM (8-bit mantissa inputs, fp32
// accumulation; what the papers' bf16 autocast does to the linear layers), keeping the MLP's widest
// tensors in bf16; their chunked delta rule takes bf16 products too. Parameters, recurrent state,
// residual stream, norms' statistics, logits and accumulators stay fp32.
enum class GemmPrecision { TF32, FP32, BF16 };
void set_gemm_precision(GemmPrecision p);
GemmPrecision gemm_precision();
// The cuBLAS handle bound to stream() (one per stream), with a fixed workspace (graph capture
// allocates nothing).
void* cublas();  // cublasHandle_t
// A cuBLASLt handle (main stream only) and its fixed workspace (what it is: kLtWorkspace bytes).
void* cublaslt();  // cublasLtHandle_t
void* lt_workspace();
constexpr size_t kLtWorkspace = 32 << 20;

// Device scratch for reductions within a single op call (stream-ordered, so calls may reuse it):
// at least `bytes` (<= kScratchBytes), 256-byte aligned. Allocated once, before any capture.
constexpr size_t kScratchBytes = 8 << 20;
void* scratch(size_t bytes);

// An owning device allocation of n elements of T (cudaMalloc; contents undefined).
template <class T>
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t n) { resize(n); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~Buffer() { release(); }
  // Reallocates when n differs (contents are lost).
  void resize(size_t n) {
    if (n == n_) return;
    release();
    if (n) LRNN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  void zero() {
    if (n_) LRNN_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), stream()));
  }
  void upload(const T* host, size_t n) {
    resize(n);
    if (n) LRNN_CUDA_CHECK(cudaMemcpyAsync(p_, host, n * sizeof(T), cudaMemcpyHostToDevice, stream()));
    synchronize();
  }
  void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
  std::vector<T> download() const {
    std::vector<T> v(n_);
    if (n_) LRNN_CUDA_CHECK(cudaMemcpyAsync(v.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost, stream()));
    synchronize();
    return v;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory (async copies from it need no staging by the driver); grows only.
template <class T>
struct Pinned {
  T* p = nullptr;
  size_t n = 0;
  Pinned() = default;
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  void resize(size_t m) {
    if (m <= n) return;
    if (p) cudaFreeHost(p);
    p = nullptr;
    n = 0;
    LRNN_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p), m * sizeof(T)));
    n = m;
  }
  ~Pinned() {
    if (p) cudaFreeHost(p);
  }
};

// True when the environment variable is set to 0, off or false (the switches LRNN_CUDA_GRAPHS,
// LRNN_CUDA_TF32).
bool env_off(const char* name);

// Per-op device time (LRNN_CUDA_PROFILE=1, or set_profiling): every CudaOps call (and the
// engine's optimizer kernels) is bracketed by events and synchronised, so the totals show where
// a step's time goes. Slows everything down and cannot be captured: the engine then launches
// eagerly.
bool profiling();
void set_profiling(bool on);
// Accumulates the device time between its construction and destruction under `name`.
class OpTimer {
 public:
  explicit OpTimer(const char* name);
  ~OpTimer();
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  const char* name_;
  cudaEvent_t start_ = nullptr;
};
struct OpTime {
  std::string name;
  double ms = 0;
  int64_t calls = 0;
};
// The totals so far, largest first; reset_profile() clears them.
std::vector<OpTime> profile();
void reset_profile();

// Launch geometry helpers for 1-D grids.
inline unsigned blocks_for(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

}  // namespace lrnn::cuda
