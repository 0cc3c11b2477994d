# NCCL for expert parallelism across GPUs (src/ep/nccl_*, symm_*): optional.
#
# Needs the NCCL 2.28 device API (nccl_device.h: symmetric windows, LSA
# pointers, LSA barriers); found only when headers AND library come from the
# same copy — mixing versions crashes at run time. -DNCCL_ROOT=<dir> (with
# include/ and lib/, e.g. the nvidia-nccl Python package:
#   python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))")
# searches only there; otherwise the system paths and the CUDA toolkit's.
# Sets NVFP4MOE_HAS_NCCL and links target `nvfp4moe` against it.
set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "NCCL installation to use (include/ and lib/)")
set(NVFP4MOE_NCCL_MIN_VERSION 22807)  # 2.28.7: the device API as used here

set(NVFP4MOE_HAS_NCCL OFF)
if(NVFP4MOE_HAS_CUDA)
  if(NCCL_ROOT)
    set(_nccl_search HINTS ${NCCL_ROOT} PATH_SUFFIXES include lib lib64 NO_DEFAULT_PATH)
  else()
    set(_nccl_search HINTS ${CUDAToolkit_LIBRARY_ROOT} ${CUDAToolkit_LIBRARY_DIR}/.. PATH_SUFFIXES include lib lib64)
  endif()
  find_path(NCCL_INCLUDE_DIR nccl_device.h ${_nccl_search})
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 ${_nccl_search})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND EXISTS ${NCCL_INCLUDE_DIR}/nccl.h)
    file(STRINGS ${NCCL_INCLUDE_DIR}/nccl.h _nccl_code REGEX "^#define NCCL_VERSION_CODE [0-9]+")
    string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _nccl_code "${_nccl_code}")
    if(_nccl_code AND _nccl_code GREATER_EQUAL NVFP4MOE_NCCL_MIN_VERSION)
      set(NVFP4MOE_HAS_NCCL ON)
      target_include_directories(nvfp4moe SYSTEM PUBLIC ${NCCL_INCLUDE_DIR})
      target_link_libraries(nvfp4moe PUBLIC ${NCCL_LIBRARY})
      target_compile_definitions(nvfp4moe PUBLIC NVFP4MOE_HAS_NCCL=1)
    else()
      message(STATUS "nvfp4moe: NCCL at ${NCCL_INCLUDE_DIR} has version code '${_nccl_code}', "
                     "below ${NVFP4MOE_NCCL_MIN_VERSION} (device API): expert parallelism over NCCL off")
    endif()
  endif()
endif()
message(STATUS "nvfp4moe: NCCL expert parallelism ${NVFP4MOE_HAS_NCCL} (${NCCL_INCLUDE_DIR} ${NCCL_LIBRARY})")
