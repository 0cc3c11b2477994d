// CUDA / cuBLAS error checks and RAII owners of device resources.
//
// Every check names the failing call, the CUDA error name and its text, so a
// failure on the device machine can be read from the log alone. Owners are
// move-only; nothing here is global.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include <cstdint>
#include <utility>

#include "nvfp4moe/error.hpp"

#define NVFP4_CUDA_CHECK(call)                                                              \
  do {                                                                                      \
    cudaError_t _e = (call);                                                                \
    if (_e != cudaSuccess)                                                                  \
      NVFP4_FAIL("CUDA error ", cudaGetErrorName(_e), " (", cudaGetErrorString(_e), ") in ", \
                 #call, " at ", __FILE__, ":", __LINE__);                                   \
  } while (0)

#define NVFP4_CUBLAS_CHECK(call)                                                          \
  do {                                                                                    \
    cublasStatus_t _s = (call);                                                           \
    if (_s != CUBLAS_STATUS_SUCCESS)                                                      \
      NVFP4_FAIL("cuBLAS error ", cublasGetStatusName(_s), " (", cublasGetStatusString(_s), \
                 ") in ", #call, " at ", __FILE__, ":", __LINE__);                        \
  } while (0)

// Checks the launch of the kernel just queued (bad configuration, no image).
#define NVFP4_CUDA_CHECK_LAUNCH(what) NVFP4_CUDA_CHECK(cudaPeekAtLastError())

namespace nvfp4moe::cuda {

// Owns `count` elements of T in device memory (cudaMalloc; never managed).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t count) : count_(count) {
    if (count) NVFP4_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFree(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      count_ = std::exchange(o.count_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* get() const { return ptr_; }
  size_t size() const { return count_; }
  size_t bytes() const { return count_ * sizeof(T); }

  void upload(const T* host, size_t n, cudaStream_t s = nullptr) {
    NVFP4_CHECK(n <= count_, "upload of ", n, " elements into a device buffer of ", count_);
    if (n) NVFP4_CUDA_CHECK(cudaMemcpyAsync(ptr_, host, n * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  void download(T* host, size_t n, cudaStream_t s = nullptr) const {
    NVFP4_CHECK(n <= count_, "download of ", n, " elements from a device buffer of ", count_);
    if (n) NVFP4_CUDA_CHECK(cudaMemcpyAsync(host, ptr_, n * sizeof(T), cudaMemcpyDeviceToHost, s));
  }

 private:
  T* ptr_ = nullptr;
  size_t count_ = 0;
};

// Owns `bytes` of page-locked host memory (cudaHostAlloc): copies between it
// and the device run asynchronously at the link's rate, where a copy from
// pageable memory goes through the driver's own staging on the calling
// thread.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) NVFP4_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&ptr_), bytes, cudaHostAllocDefault));
  }
  ~PinnedBuffer() {
    if (ptr_) cudaFreeHost(ptr_);
  }
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_) cudaFreeHost(ptr_);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  uint8_t* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  uint8_t* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// SMs of the current device.
inline int sm_count() {
  int device = 0, sms = 0;
  NVFP4_CUDA_CHECK(cudaGetDevice(&device));
  NVFP4_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// CTAs of `kernel` resident at once on the current device (SMs x occupancy,
// at least one per SM): the grid of a persistent kernel.
template <typename Kernel>
int64_t resident_ctas(Kernel kernel, int threads, size_t smem) {
  int per_sm = 0;
  NVFP4_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return int64_t(sm_count()) * std::max(1, per_sm);
}

// Whether p is a multiple of `bytes` (a power of two): vector loads and stores.
inline bool aligned_to(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0; }

// Raises (never lowers) a kernel's dynamic shared-memory opt-in on the
// current device: layers of different sizes can share a process. The
// default allows 48 KB less the kernel's static shared memory, so a dynamic
// size under 48 KB can need it too (the decode GEMM's 2x2 items fill the 48
// KB exactly: 32 KB of ring and 16 KB of static arrays; 16 bytes more
// static and their launch fails with an invalid argument). Launches with no
// dynamic shared memory make no driver call.
template <typename Kernel>
void allow_smem_at_least(Kernel kernel, size_t bytes) {
  if (bytes == 0) return;
  cudaFuncAttributes attr{};
  NVFP4_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (size_t(attr.maxDynamicSharedSizeBytes) < bytes)
    NVFP4_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

class CudaEvent {
 public:
  explicit CudaEvent(unsigned flags = cudaEventDefault) { NVFP4_CUDA_CHECK(cudaEventCreateWithFlags(&e_, flags)); }
  ~CudaEvent() {
    if (e_) cudaEventDestroy(e_);
  }
  CudaEvent(CudaEvent&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t get() const { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

class CudaStream {
 public:
  CudaStream() { NVFP4_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  ~CudaStream() {
    if (s_) cudaStreamDestroy(s_);
  }
  CudaStream(CudaStream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

// The work `queue()` puts on stream s, captured (thread-local mode: other
// threads' work is not caught) into an executable graph that launch() replays
// on any stream. A capture that throws is ended and its graph dropped.
class CudaGraphExec {
 public:
  template <typename Queue>
  CudaGraphExec(cudaStream_t s, Queue&& queue) {
    NVFP4_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
      queue();
    } catch (...) {
      if (cudaStreamEndCapture(s, &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
      throw;
    }
    NVFP4_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    const cudaError_t e = cudaGraphInstantiate(&exec_, graph, 0);
    cudaGraphDestroy(graph);
    NVFP4_CUDA_CHECK(e);
  }
  ~CudaGraphExec() {
    if (exec_) cudaGraphExecDestroy(exec_);
  }
  CudaGraphExec(CudaGraphExec&& o) noexcept : exec_(std::exchange(o.exec_, nullptr)) {}
  CudaGraphExec(const CudaGraphExec&) = delete;
  CudaGraphExec& operator=(const CudaGraphExec&) = delete;
  void launch(cudaStream_t s) const { NVFP4_CUDA_CHECK(cudaGraphLaunch(exec_, s)); }

 private:
  cudaGraphExec_t exec_ = nullptr;
};

// A side branch of a stream: work queued on side() between fork(main) and
// join(main) runs next to main's work queued in between, and becomes a
// parallel branch of the graph when main is being captured. Every fork must
// be joined before main's work that reads the branch's results (and before a
// capture ends). The side stream has the lowest priority: the branch fills
// the SMs that main's kernels leave idle rather than delaying them.
class StreamBranch {
 public:
  StreamBranch() {
    int least = 0, greatest = 0;
    NVFP4_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    NVFP4_CUDA_CHECK(cudaStreamCreateWithPriority(&side_, cudaStreamNonBlocking, least));
  }
  ~StreamBranch() {
    if (side_) cudaStreamDestroy(side_);
  }
  StreamBranch(StreamBranch&& o) noexcept
      : side_(std::exchange(o.side_, nullptr)), fork_(std::move(o.fork_)), join_(std::move(o.join_)) {}
  StreamBranch(const StreamBranch&) = delete;
  StreamBranch& operator=(const StreamBranch&) = delete;

  // The side stream, ordered after everything queued on main so far.
  cudaStream_t fork(cudaStream_t main) {
    NVFP4_CUDA_CHECK(cudaEventRecord(fork_.get(), main));
    NVFP4_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_.get(), 0));
    return side_;
  }
  // Main's later work waits for everything queued on the side stream.
  void join(cudaStream_t main) {
    NVFP4_CUDA_CHECK(cudaEventRecord(join_.get(), side_));
    NVFP4_CUDA_CHECK(cudaStreamWaitEvent(main, join_.get(), 0));
  }

 private:
  cudaStream_t side_ = nullptr;
  CudaEvent fork_{cudaEventDisableTiming}, join_{cudaEventDisableTiming};
};

class CublasHandle {
 public:
  CublasHandle() { NVFP4_CUBLAS_CHECK(cublasCreate(&h_)); }
  ~CublasHandle() {
    if (h_) cublasDestroy(h_);
  }
  CublasHandle(CublasHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

// Makes `device` current for a scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    NVFP4_CUDA_CHECK(cudaGetDevice(&prev_));
    if (prev_ != device) NVFP4_CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(prev_); }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace nvfp4moe::cuda
