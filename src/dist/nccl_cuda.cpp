#include "dist/nccl.h"
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <glob.h>
#include <thread>
#include <vector>
#include "core/check.h"
#include "cuda/runtime.h"

namespace lrnn::dist {

namespace {

// The few declarations of nccl.h lrnn uses (NCCL's C ABI, stable since 2.0; ncclAvg since 2.10).
using ncclResult_t = int;
using ncclComm_t = void*;
struct ncclUniqueId {
  char internal[128];
};
constexpr ncclResult_t kSuccess = 0, kInProgress = 7;
int nccl_type(DType t) { return t == DType::F32 ? 7 : t == DType::F64 ? 8 : 2; }  // ncclFloat32, ncclFloat64, ncclInt32
int nccl_op(Op o) { return o == Op::Sum ? 0 : o == Op::Max ? 2 : 4; }          // ncclSum, ncclMax, ncclAvg
constexpr int kFloat32 = 7;

struct Api {
  void* lib = nullptr;
  std::string path;
  ncclResult_t (*GetVersion)(int*);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  const char* (*GetErrorString)(ncclResult_t);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, int, ncclComm_t, cudaStream_t);
};

std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const char* p = std::getenv("LRNN_NCCL_LIBRARY")) return {p};
  c.push_back("libnccl.so.2");
  std::vector<std::string> patterns = {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                                       "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                                       "/usr/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                                       "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                                       "/opt/conda/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                                       "/usr/local/cuda/lib64/libnccl.so.2"};
  for (const char* env : {"VIRTUAL_ENV", "CONDA_PREFIX"})
    if (const char* p = std::getenv(env)) patterns.insert(patterns.begin(), std::string(p) + "/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2");
  if (const char* h = std::getenv("HOME")) patterns.push_back(std::string(h) + "/.local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2");
  for (auto& pat : patterns) {
    glob_t g{};
    if (::glob(pat.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) c.push_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  return c;
}

const Api& api() {
  static const Api a = [] {
    Api a{};
    std::string tried;
    for (auto& p : candidates()) {
      a.lib = ::dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (a.lib) {
        a.path = p;
        break;
      }
      tried += fmt::format("\n  {}: {}", p, ::dlerror());
    }
    if (!a.lib)
      LRNN_USER_ERROR("training on several GPUs needs NCCL (libnccl.so.2), which was not found:{}\nInstall it "
                      "(pip install nvidia-nccl-cu13, or the distribution's libnccl2) or point LRNN_NCCL_LIBRARY at "
                      "the library", tried);
    auto sym = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(::dlsym(a.lib, name));
      if (!f) LRNN_USER_ERROR("{}: has no {} (NCCL 2.10 or newer is needed)", a.path, name);
    };
    sym(a.GetVersion, "ncclGetVersion");
    sym(a.GetUniqueId, "ncclGetUniqueId");
    sym(a.CommInitRank, "ncclCommInitRank");
    sym(a.CommDestroy, "ncclCommDestroy");
    sym(a.CommAbort, "ncclCommAbort");
    sym(a.CommGetAsyncError, "ncclCommGetAsyncError");
    sym(a.GetErrorString, "ncclGetErrorString");
    sym(a.AllReduce, "ncclAllReduce");
    sym(a.ReduceScatter, "ncclReduceScatter");
    sym(a.AllGather, "ncclAllGather");
    int v = 0;
    a.GetVersion(&v);
    if (v < 21000) LRNN_USER_ERROR("{}: NCCL {} is too old (2.10 or newer is needed)", a.path, v);
    return a;
  }();
  return a;
}

void check(ncclResult_t r, const char* what, const World& w) {
  if (r == kSuccess || r == kInProgress) return;
  throw Error(fmt::format("rank {}: NCCL {} failed: {}", w.rank, what, api().GetErrorString(r)));
}

}  // namespace

Nccl::Nccl(const World& w) : w_(w) {
  const Api& a = api();
  ncclUniqueId id{};
  std::string blob;
  if (w.leader()) {
    check(a.GetUniqueId(&id), "GetUniqueId", w);
    blob.assign(id.internal, sizeof id.internal);
  }
  blob = exchange(w, blob, timeout_seconds());
  LRNN_CHECK(blob.size() == sizeof id.internal, "rendezvous payload of {} bytes", blob.size());
  std::memcpy(id.internal, blob.data(), sizeof id.internal);
  check(a.CommInitRank(&comm_, w.size, id, w.rank), "CommInitRank", w);
}

Nccl::~Nccl() {
  if (comm_) api().CommDestroy(comm_);
}

std::string Nccl::version() const {
  int v = 0;
  api().GetVersion(&v);
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

void Nccl::all_reduce(void* buf, size_t n, DType t, Op op) {
  check(api().AllReduce(buf, buf, n, nccl_type(t), nccl_op(op), comm_, cuda::stream()), "AllReduce", w_);
}

void Nccl::reduce_scatter(float* buf, size_t shard, Op op) {
  check(api().ReduceScatter(buf, buf + size_t(w_.rank) * shard, shard, kFloat32, nccl_op(op), comm_, cuda::stream()),
        "ReduceScatter", w_);
}

void Nccl::all_gather(float* buf, size_t shard) {
  check(api().AllGather(buf + size_t(w_.rank) * shard, buf, shard, kFloat32, comm_, cuda::stream()), "AllGather", w_);
}

void Nccl::wait(cudaEvent_t event, const char* what) {
  using Clock = std::chrono::steady_clock;
  const double limit = timeout_seconds();
  const auto t0 = Clock::now();
  for (int spin = 0;; ++spin) {
    const cudaError_t q = cudaEventQuery(event);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) LRNN_CUDA_CHECK(q);
    ncclResult_t async = kSuccess;
    api().CommGetAsyncError(comm_, &async);
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if ((async != kSuccess && async != kInProgress) || waited > limit) {
      const std::string why = async != kSuccess && async != kInProgress
                                  ? fmt::format("NCCL reported an error: {}", api().GetErrorString(async))
                                  : fmt::format("no progress for {:.0f} s (LRNN_DIST_TIMEOUT): another rank has "
                                                "probably failed or stopped", waited);
      std::fprintf(stderr, "lrnn: rank %d of %d, waiting for %s: %s; aborting the job\n", w_.rank, w_.size, what,
                   why.c_str());
      std::fflush(stderr);
      // ncclCommAbort can itself block while a collective kernel still waits for the dead peer (seen
      // on 2 x H100, NCCL 2.28.9: rank 0 printed the line above and was still running 70 s later),
      // so it gets a few seconds on a thread of its own; the exit does not wait longer than that.
      // Process exit tears the CUDA context down, kernels included.
      void* comm = comm_;
      comm_ = nullptr;
      std::thread([comm] { api().CommAbort(comm); }).detach();
      std::this_thread::sleep_for(std::chrono::seconds(5));
      std::_Exit(3);  // no destructors: they would wait on a stream that may never finish
    }
    if (spin > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace lrnn::dist
