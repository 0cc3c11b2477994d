// SymmBuffer: one rank's segment of a symmetric NCCL window and the device
// communicator that reaches its peers (NCCL 2.28 device API).
//
//   ncclMemAlloc           the segment (cuMem-backed, so NCCL can map it into
//                          every peer's address space)
//   ncclCommWindowRegister NCCL_WIN_COLL_SYMMETRIC: every rank registers a
//                          buffer of the same size, so an offset valid here is
//                          valid in every peer's segment (ncclGetLsaPointer)
//   ncclDevCommCreate      the device communicator with `lsa_barriers` LSA
//                          barriers; requirements zero-initialised (2.28: any
//                          field left unset must be 0), no multimem
//                          (NVLink SHARP stays off, see docs/ep.md)
//
// Construction and destruction are COLLECTIVE: every rank of the communicator
// creates and destroys its SymmBuffer in the same order with the same size.
#pragma once

#if defined(NVFP4MOE_HAS_NCCL)

#include <nccl.h>
#include <nccl_device.h>

#include <cstddef>

#include "nvfp4moe/error.hpp"

#define NVFP4_NCCL_CHECK(call)                                                                                \
  do {                                                                                                        \
    ncclResult_t _r = (call);                                                                                 \
    if (_r != ncclSuccess)                                                                                    \
      NVFP4_FAIL("NCCL error ", int(_r), " (", ncclGetErrorString(_r), ") in ", #call, " at ", __FILE__, ":", \
                 __LINE__);                                                                                   \
  } while (0)

namespace nvfp4moe::ep {

class SymmBuffer {
 public:
  SymmBuffer(ncclComm_t comm, size_t bytes, int lsa_barriers);
  ~SymmBuffer();
  SymmBuffer(const SymmBuffer&) = delete;
  SymmBuffer& operator=(const SymmBuffer&) = delete;

  char* local() const { return ptr_; }          // this rank's segment (device pointer)
  ncclWindow_t window() const { return win_; }  // for ncclGetLsaPointer in kernels
  const ncclDevComm& dev_comm() const { return dev_; }
  size_t bytes() const { return bytes_; }       // as allocated: the request rounded up to 2 MiB

 private:
  ncclComm_t comm_ = nullptr;
  char* ptr_ = nullptr;
  size_t bytes_ = 0;
  ncclWindow_t win_ = nullptr;
  ncclDevComm dev_{};
  bool dev_created_ = false;
};

}  // namespace nvfp4moe::ep

#endif  // NVFP4MOE_HAS_NCCL
