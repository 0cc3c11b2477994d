// SymmBuffer (see symm_buffer.hpp).
#if defined(NVFP4MOE_HAS_NCCL)

#include <cuda_runtime.h>

#include "ep/symm_buffer.hpp"

namespace nvfp4moe::ep {

// Whole 2 MiB pages (the cuMem granularity of large pages): every rank
// registers the same, page-aligned size.
constexpr size_t kSymmGranularity = size_t(2) << 20;

SymmBuffer::SymmBuffer(ncclComm_t comm, size_t bytes, int lsa_barriers)
    : comm_(comm), bytes_((bytes + kSymmGranularity - 1) / kSymmGranularity * kSymmGranularity) {
  NVFP4_CHECK(comm != nullptr, "SymmBuffer: null NCCL communicator");
  NVFP4_CHECK(bytes > 0 && lsa_barriers >= 1, "SymmBuffer: bytes=", bytes, " lsa_barriers=", lsa_barriers);
  bytes = bytes_;
  try {
    NVFP4_NCCL_CHECK(ncclMemAlloc(reinterpret_cast<void**>(&ptr_), bytes));
    // Zero once: error words, flags and counters start clear on every rank.
    if (cudaMemset(ptr_, 0, bytes) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
      NVFP4_FAIL("SymmBuffer: clearing ", bytes, " bytes of the symmetric segment failed");
    NVFP4_NCCL_CHECK(ncclCommWindowRegister(comm, ptr_, bytes, &win_, NCCL_WIN_COLL_SYMMETRIC));
#if defined(NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER)
    // Newer headers (2.30) define it: the struct carries its size, magic and
    // version, and not all of its defaults are zero.
    ncclDevCommRequirements reqs = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
#else
    ncclDevCommRequirements reqs{};  // 2.28: every field not set here must be zero
#endif
    reqs.lsaBarrierCount = lsa_barriers;
    NVFP4_NCCL_CHECK(ncclDevCommCreate(comm, &reqs, &dev_));
    dev_created_ = true;
    NVFP4_CHECK(dev_.lsaSize == dev_.nRanks, "SymmBuffer: ", dev_.nRanks, " ranks but only ", dev_.lsaSize,
                " are load/store accessible (LSA); expert parallelism over NCCL needs every rank in one NVLink "
                "domain");
  } catch (...) {
    this->~SymmBuffer();  // a constructor that throws gets no destructor call: release what was made
    throw;
  }
}

SymmBuffer::~SymmBuffer() {
  // Nothing may still run that uses the window: the owner synchronises first.
  if (dev_created_) ncclDevCommDestroy(comm_, &dev_);
  dev_created_ = false;
  if (win_) ncclCommWindowDeregister(comm_, win_);
  win_ = nullptr;
  if (ptr_) ncclMemFree(ptr_);
  ptr_ = nullptr;
}

}  // namespace nvfp4moe::ep

#endif  // NVFP4MOE_HAS_NCCL
