#include "cuda/runtime.h"
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <cublasLt.h>
#include <cublas_v2.h>
#include <fmt/format.h>
#include "core/check.h"

namespace lrnn::cuda {

void fail(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(fmt::format("{}:{}: CUDA error {} ({}) in {}", file, line, cudaGetErrorName(e),
                          cudaGetErrorString(e), what));
}

int device_count() {
  static const int n = [] {
    int c = 0;
    if (cudaGetDeviceCount(&c) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return 0;
    }
    return c;
  }();
  return n;
}

bool available() { return device_count() > 0; }

int select_device(int index) {
  int n = 0;
  LRNN_CUDA_CHECK(cudaGetDeviceCount(&n));
  const int d = n > 0 ? index % n : 0;
  LRNN_CUDA_CHECK(cudaSetDevice(d));
  return d;
}

std::string device_name() {
  if (!available()) return "no CUDA device";
  cudaDeviceProp p{};
  int dev = 0;
  LRNN_CUDA_CHECK(cudaGetDevice(&dev));
  LRNN_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  return fmt::format("{}, sm_{}{}, {} SMs, {:.0f} GiB", p.name, p.major, p.minor, p.multiProcessorCount,
                     double(p.totalGlobalMem) / double(1 << 30));
}

static std::string cuda_version_text(int v) { return fmt::format("{}.{}", v / 1000, v % 1000 / 10); }
std::string driver_version() {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess && v > 0 ? cuda_version_text(v) : "none";
}
std::string runtime_version() {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? cuda_version_text(v) : "unknown";
}

namespace {
int device_attr(cudaDeviceAttr what) {
  int dev = 0, x = 0;
  LRNN_CUDA_CHECK(cudaGetDevice(&dev));
  LRNN_CUDA_CHECK(cudaDeviceGetAttribute(&x, what, dev));
  return x;
}
}  // namespace

int num_sms() {
  static const int v = std::max(1, device_attr(cudaDevAttrMultiProcessorCount));
  return v;
}

int max_smem_optin() {
  static const int v = device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  return v;
}

size_t max_dynamic_smem(const void* kernel) {
  cudaFuncAttributes attr{};
  LRNN_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  const size_t most = size_t(max_smem_optin());
  return attr.sharedSizeBytes >= most ? 0 : most - attr.sharedSizeBytes;
}

void allow_max_dynamic_smem(const void* kernel) {
  LRNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(max_dynamic_smem(kernel))));
}

namespace {

struct Context {
  cudaStream_t stream = nullptr, side = nullptr;
  cublasHandle_t blas = nullptr, blas_side = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace_lt = nullptr;
  void* workspace = nullptr;
  void* workspace_side = nullptr;
  void* scratch = nullptr;
  GemmPrecision precision = GemmPrecision::TF32;
  bool on_side = false;
  // Events for fork/unfork: used round-robin (a ticket is waited on within the same step, long
  // before its event comes round again).
  static constexpr int kEvents = 64;
  cudaEvent_t events[kEvents] = {};
  int next_event = 0, last_ticket = -1;
  static constexpr size_t kScratch = kScratchBytes, kWorkspace = 32 << 20;

  Context() {
    LRNN_CHECK(available(), "CUDA was asked for, but no CUDA device is available");
    // The current device: 0 unless select_device() chose another (one process per GPU). Setting
    // it again makes its primary context current on this thread.
    int dev = 0;
    LRNN_CUDA_CHECK(cudaGetDevice(&dev));
    LRNN_CUDA_CHECK(cudaSetDevice(dev));
    LRNN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LRNN_CUDA_CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    LRNN_CUDA_CHECK(cudaMalloc(&scratch, kScratch));
    LRNN_CUDA_CHECK(cudaMalloc(&workspace, kWorkspace));
    LRNN_CUDA_CHECK(cudaMalloc(&workspace_side, kWorkspace));
    blas = make_handle(stream, workspace);
    blas_side = make_handle(side, workspace_side);
    // The side stream's GEMMs (weight gradients) are sized for half the SMs, leaving room for the
    // main stream's kernels next to them: measured on the H200 (DeltaNet P1, B = 1024) 2.13 ->
    // 2.11 ms per step, and 2.17 -> 2.14 in a second build; a third of the SMs was slower.
    // LRNN_SIDE_SMS overrides the count (0: cuBLAS's default, all SMs).
    int side_sms = std::max(1, num_sms() / 2);
    if (const char* e = std::getenv("LRNN_SIDE_SMS")) side_sms = std::atoi(e);
    if (side_sms > 0)
      LRNN_CHECK(cublasSetSmCountTarget(blas_side, side_sms) == CUBLAS_STATUS_SUCCESS, "cublasSetSmCountTarget failed");
    LRNN_CUDA_CHECK(cudaMalloc(&workspace_lt, kLtWorkspace));
    LRNN_CHECK(cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS, "cublasLtCreate failed");
    for (auto& e : events) LRNN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    apply_precision();
  }
  static cublasHandle_t make_handle(cudaStream_t s, void* ws) {
    cublasHandle_t h = nullptr;
    LRNN_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
    LRNN_CHECK(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS, "cublasSetStream failed");
    // A fixed workspace: cuBLAS then allocates nothing inside a captured graph.
    LRNN_CHECK(cublasSetWorkspace(h, ws, kWorkspace) == CUBLAS_STATUS_SUCCESS, "cublasSetWorkspace failed");
    return h;
  }
  void apply_precision() {
    auto mode = precision == GemmPrecision::FP32 ? CUBLAS_PEDANTIC_MATH : CUBLAS_TF32_TENSOR_OP_MATH;
    for (auto h : {blas, blas_side})
      LRNN_CHECK(cublasSetMathMode(h, mode) == CUBLAS_STATUS_SUCCESS, "cublasSetMathMode failed");
  }
  // Records an event on s and returns its index.
  int record(cudaStream_t s) {
    const int i = next_event;
    next_event = (next_event + 1) % kEvents;
    LRNN_CUDA_CHECK(cudaEventRecord(events[i], s));
    return i;
  }
};

Context& ctx() {
  static Context c;
  return c;
}

}  // namespace

cudaStream_t stream() { return ctx().on_side ? ctx().side : ctx().stream; }

void synchronize() {
  LRNN_CUDA_CHECK(cudaStreamSynchronize(ctx().side));
  LRNN_CUDA_CHECK(cudaStreamSynchronize(ctx().stream));
}

void fork() {
  Context& c = ctx();
  LRNN_CHECK(!c.on_side, "cuda::fork: already on the side stream");
  LRNN_CUDA_CHECK(cudaStreamWaitEvent(c.side, c.events[c.record(c.stream)], 0));
  c.on_side = true;
}

int unfork() {
  Context& c = ctx();
  LRNN_CHECK(c.on_side, "cuda::unfork without fork");
  c.on_side = false;
  return c.last_ticket = c.record(c.side);
}

void wait(int ticket) {
  Context& c = ctx();
  LRNN_CHECK(!c.on_side && ticket >= 0 && ticket < Context::kEvents, "cuda::wait: bad ticket {}", ticket);
  LRNN_CUDA_CHECK(cudaStreamWaitEvent(c.stream, c.events[ticket], 0));
}

void join() {
  Context& c = ctx();
  if (c.last_ticket < 0) return;  // nothing forked since the last join
  wait(c.last_ticket);
  c.last_ticket = -1;
}

void set_gemm_precision(GemmPrecision p) {
  ctx().precision = p;
  ctx().apply_precision();
}
GemmPrecision gemm_precision() { return ctx().precision; }

void* cublas() { return ctx().on_side ? ctx().blas_side : ctx().blas; }

void* cublaslt() {
  LRNN_CHECK(!ctx().on_side, "cuBLASLt is for the main stream only");
  return ctx().lt;
}
void* lt_workspace() { return ctx().workspace_lt; }

void* scratch(size_t bytes) {
  LRNN_CHECK(!ctx().on_side, "cuda scratch used on the side stream");
  LRNN_CHECK(bytes <= Context::kScratch, "cuda scratch: {} bytes asked, {} available", bytes, Context::kScratch);
  return ctx().scratch;
}

namespace {
struct Profile {
  bool on = [] {
    const char* v = std::getenv("LRNN_CUDA_PROFILE");
    return v && v[0] == '1';
  }();
  std::map<std::string, OpTime> ops;
  std::vector<cudaEvent_t> free_events;
};
Profile& prof() {
  static Profile p;
  return p;
}
}  // namespace

bool profiling() { return prof().on; }
void set_profiling(bool on) { prof().on = on; }

OpTimer::OpTimer(const char* name) : name_(name) {
  if (!prof().on) return;
  LRNN_CUDA_CHECK(cudaEventCreate(&start_));
  LRNN_CUDA_CHECK(cudaEventRecord(start_, stream()));
}

OpTimer::~OpTimer() {
  if (!start_) return;
  cudaEvent_t stop = nullptr;
  float ms = 0;
  if (cudaEventCreate(&stop) == cudaSuccess && cudaEventRecord(stop, stream()) == cudaSuccess &&
      cudaEventSynchronize(stop) == cudaSuccess && cudaEventElapsedTime(&ms, start_, stop) == cudaSuccess) {
    OpTime& t = prof().ops[name_];
    t.name = name_;
    t.ms += ms;
    t.calls += 1;
  }
  if (stop) cudaEventDestroy(stop);
  cudaEventDestroy(start_);
}

std::vector<OpTime> profile() {
  std::vector<OpTime> v;
  for (auto& [k, t] : prof().ops) v.push_back(t);
  std::sort(v.begin(), v.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return v;
}
void reset_profile() { prof().ops.clear(); }

bool env_off(const char* name) {
  const char* v = std::getenv(name);
  return v && (std::strcmp(v, "0") == 0 || std::strcmp(v, "off") == 0 || std::strcmp(v, "false") == 0);
}

}  // namespace lrnn::cuda
