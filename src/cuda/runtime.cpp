#include "cuda/runtime.h"
#include <algorithm>
#include <cstdlib>
#include <map>
#include <cublas_v2.h>
#include <fmt/format.h>
#include "core/check.h"

namespace lrnn::cuda {

void fail(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(fmt::format("{}:{}: CUDA error {} ({}) in {}", file, line, cudaGetErrorName(e),
                          cudaGetErrorString(e), what));
}

bool available() {
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky "no driver" error
      return false;
    }
    return n > 0;
  }();
  return ok;
}

std::string device_name() {
  if (!available()) return "no CUDA device";
  cudaDeviceProp p{};
  LRNN_CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
  return fmt::format("{}, sm_{}{}, {} SMs, {:.0f} GiB", p.name, p.major, p.minor, p.multiProcessorCount,
                     double(p.totalGlobalMem) / double(1 << 30));
}

int num_sms() {
  static const int v = [] {
    int dev = 0, n = 0;
    LRNN_CUDA_CHECK(cudaGetDevice(&dev));
    LRNN_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n > 0 ? n : 1;
  }();
  return v;
}

namespace {

struct Context {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  void* scratch = nullptr;
  GemmPrecision precision = GemmPrecision::TF32;
  static constexpr size_t kScratch = 1 << 20, kWorkspace = 32 << 20;

  Context() {
    LRNN_CHECK(available(), "CUDA was asked for, but no CUDA device is available");
    LRNN_CUDA_CHECK(cudaSetDevice(0));
    LRNN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    LRNN_CUDA_CHECK(cudaMalloc(&scratch, kScratch));
    LRNN_CUDA_CHECK(cudaMalloc(&workspace, kWorkspace));
    LRNN_CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS, "cublasCreate failed");
    LRNN_CHECK(cublasSetStream(blas, stream) == CUBLAS_STATUS_SUCCESS, "cublasSetStream failed");
    // A fixed workspace: cuBLAS then allocates nothing inside a captured graph.
    LRNN_CHECK(cublasSetWorkspace(blas, workspace, kWorkspace) == CUBLAS_STATUS_SUCCESS, "cublasSetWorkspace failed");
    apply_precision();
  }
  void apply_precision() {
    auto mode = precision == GemmPrecision::TF32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH;
    LRNN_CHECK(cublasSetMathMode(blas, mode) == CUBLAS_STATUS_SUCCESS, "cublasSetMathMode failed");
  }
};

Context& ctx() {
  static Context c;
  return c;
}

}  // namespace

cudaStream_t stream() { return ctx().stream; }

void synchronize() { LRNN_CUDA_CHECK(cudaStreamSynchronize(ctx().stream)); }

void set_gemm_precision(GemmPrecision p) {
  ctx().precision = p;
  ctx().apply_precision();
}
GemmPrecision gemm_precision() { return ctx().precision; }

void* cublas() { return ctx().blas; }

void* scratch(size_t bytes) {
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

}  // namespace lrnn::cuda
