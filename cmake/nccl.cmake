# NCCL for expert parallelism across GPUs (src/ep/nccl_*, symm_*): optional.
#
# Needs NCCL's device API as src/ep uses it: nccl_device.h (ncclDevComm,
# ncclDevCommCreate, ncclLsaBarrierSession, ncclGetLsaPointer) and the
# symmetric windows of nccl.h (ncclMemAlloc, ncclCommWindowRegister with
# NCCL_WIN_COLL_SYMMETRIC): NCCL >= 2.28.7. Headers and library must come
# from ONE copy of the same version (mixing them crashes at run time), so a
# copy is taken whole from one directory with include/ and lib/, the first
# of:
#   1. -DNCCL_ROOT=<dir> (or -DNCCL_HOME, or the environment's NCCL_ROOT,
#      then NCCL_HOME):
#      only there; a copy without the device API turns NCCL off;
#   2. the nvidia-nccl-cu13 / -cu12 pip package (torch's) of the configured
#      Python interpreter (Python_EXECUTABLE, Python3_EXECUTABLE, else
#      python3 on PATH) — where torch runs, this is the libnccl.so.2 its
#      process loads;
#   3. the system: the CUDA toolkit's directories, then the default paths.
# A copy whose headers lack the device API, or whose library reports
# another version than its headers, is passed over (and named). The library
# is linked by its full path, its directory in the RPATH of every binary
# (also after install), so nothing needs LD_LIBRARY_PATH. One status line
# says what was found and from where.
#
# Sets NVFP4MOE_HAS_NCCL (and the define) and links target `nvfp4moe`.
set(NCCL_ROOT "$ENV{NCCL_ROOT}" CACHE PATH "NCCL installation to use (include/ and lib/); empty: search")
if(NOT NCCL_ROOT AND NCCL_HOME)
  set(NCCL_ROOT "${NCCL_HOME}")
elseif(NOT NCCL_ROOT AND DEFINED ENV{NCCL_HOME})
  set(NCCL_ROOT "$ENV{NCCL_HOME}")
endif()
set(NVFP4MOE_NCCL_MIN_VERSION 22807)  # 2.28.7: the device API as used here

# Checks the copy with headers in `inc` and library `lib`; sets
# _nccl_ok (TRUE/FALSE), _nccl_version ("2.28.9") and _nccl_why.
function(_nvfp4moe_check_nccl inc lib)
  set(_nccl_ok FALSE PARENT_SCOPE)
  if(NOT EXISTS "${inc}/nccl.h" OR NOT EXISTS "${inc}/nccl_device.h")
    set(_nccl_why "no nccl.h with nccl_device.h in ${inc}" PARENT_SCOPE)
    return()
  endif()
  if(NOT lib OR NOT EXISTS "${lib}")
    set(_nccl_why "no libnccl next to ${inc}" PARENT_SCOPE)
    return()
  endif()
  file(STRINGS "${inc}/nccl.h" _code REGEX "^#define NCCL_VERSION_CODE [0-9]+")
  file(STRINGS "${inc}/nccl.h" _ver REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) [0-9]+")
  string(REGEX REPLACE ".* ([0-9]+)$" "\\1" _code "${_code}")
  string(REGEX REPLACE "[^;]*NCCL_[A-Z]+ ([0-9]+)" "\\1" _ver "${_ver}")
  string(REPLACE ";" "." _ver "${_ver}")
  set(_nccl_version "${_ver}" PARENT_SCOPE)
  if(NOT _code OR _code LESS NVFP4MOE_NCCL_MIN_VERSION)
    set(_nccl_why "${inc}: NCCL ${_ver} (version code '${_code}') is below 2.28.7, no device API as used here"
        PARENT_SCOPE)
    return()
  endif()
  file(GLOB _dev_headers "${inc}/nccl_device/*.h")
  set(_has_dev_comm FALSE)
  foreach(h "${inc}/nccl_device.h" ${_dev_headers})
    file(STRINGS "${h}" _hit REGEX "ncclDevCommCreate" LIMIT_COUNT 1)
    if(_hit)
      set(_has_dev_comm TRUE)
      break()
    endif()
  endforeach()
  if(NOT _has_dev_comm)
    set(_nccl_why "${inc}: NCCL ${_ver} headers declare no ncclDevCommCreate" PARENT_SCOPE)
    return()
  endif()
  # The library's own version string ("NCCL version 2.28.9+cuda13.0") must be the headers'.
  file(STRINGS "${lib}" _lib_ver REGEX "NCCL version [0-9]+\\.[0-9]+\\.[0-9]+" LIMIT_COUNT 1)
  string(REGEX MATCH "[0-9]+\\.[0-9]+\\.[0-9]+" _lib_ver "${_lib_ver}")
  if(_lib_ver AND NOT _lib_ver STREQUAL _ver)
    set(_nccl_why "${lib} is NCCL ${_lib_ver} but ${inc}/nccl.h is ${_ver}" PARENT_SCOPE)
    return()
  endif()
  set(_nccl_ok TRUE PARENT_SCOPE)
endfunction()

# The library of a copy rooted at `root`: lib/ or lib64/, libnccl.so.2
# (what the pip package ships) or libnccl.so.
function(_nvfp4moe_nccl_library root out)
  set(${out} "" PARENT_SCOPE)
  foreach(d lib lib64)
    foreach(n libnccl.so.2 libnccl.so)
      if(EXISTS "${root}/${d}/${n}")
        set(${out} "${root}/${d}/${n}" PARENT_SCOPE)
        return()
      endif()
    endforeach()
  endforeach()
endfunction()

set(NVFP4MOE_HAS_NCCL OFF)
set(_nccl_found_inc "")
set(_nccl_found_lib "")
set(_nccl_source "")
set(_nccl_passed "")  # copies passed over, for the status line
if(NVFP4MOE_HAS_CUDA)
  # 1. An explicit root: authoritative.
  if(NCCL_ROOT)
    _nvfp4moe_nccl_library("${NCCL_ROOT}" _lib)
    _nvfp4moe_check_nccl("${NCCL_ROOT}/include" "${_lib}")
    if(_nccl_ok)
      set(_nccl_found_inc "${NCCL_ROOT}/include")
      set(_nccl_found_lib "${_lib}")
      set(_nccl_source "NCCL_ROOT")
    else()
      message(WARNING "nvfp4moe: NCCL_ROOT=${NCCL_ROOT} has no usable NCCL (${_nccl_why}); "
                      "expert parallelism over NCCL is off")
      list(APPEND _nccl_passed "NCCL_ROOT: ${_nccl_why}")
    endif()
  else()
    # 2. The pip package of the configured Python interpreter.
    if(Python_EXECUTABLE)
      set(_nccl_python "${Python_EXECUTABLE}")
    elseif(Python3_EXECUTABLE)
      set(_nccl_python "${Python3_EXECUTABLE}")
    else()
      find_program(_nccl_python NAMES python3 python NO_CACHE)
    endif()
    if(_nccl_python)
      # nvidia.nccl is a namespace package in the cu13 wheels (no __file__): its first path.
      execute_process(
        COMMAND "${_nccl_python}" -c "import nvidia.nccl as m, os; f = getattr(m, '__file__', None); print(os.path.dirname(f) if f else list(m.__path__)[0])"
        OUTPUT_VARIABLE _pip_root OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _pip_rc ERROR_QUIET)
      if(_pip_rc EQUAL 0 AND _pip_root)
        _nvfp4moe_nccl_library("${_pip_root}" _lib)
        _nvfp4moe_check_nccl("${_pip_root}/include" "${_lib}")
        if(_nccl_ok)
          set(_nccl_found_inc "${_pip_root}/include")
          set(_nccl_found_lib "${_lib}")
          set(_nccl_source "pip package nvidia.nccl of ${_nccl_python}")
        else()
          list(APPEND _nccl_passed "pip package of ${_nccl_python}: ${_nccl_why}")
        endif()
      endif()
    endif()
    # 3. The system.
    if(NOT _nccl_found_lib)
      find_path(_sys_inc nccl_device.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}
                PATH_SUFFIXES include NO_CACHE)
      if(_sys_inc)
        # The library of the same copy: beside the headers' directory first.
        find_library(_sys_lib NAMES nccl libnccl.so.2 HINTS "${_sys_inc}/.." ${CUDAToolkit_LIBRARY_DIR}
                     PATH_SUFFIXES lib lib64 NO_CACHE)
        _nvfp4moe_check_nccl("${_sys_inc}" "${_sys_lib}")
        if(_nccl_ok)
          get_filename_component(_nccl_found_inc "${_sys_inc}" REALPATH)
          get_filename_component(_nccl_found_lib "${_sys_lib}" REALPATH)
          set(_nccl_source "system")
        else()
          list(APPEND _nccl_passed "system: ${_nccl_why}")
        endif()
      endif()
    endif()
  endif()

  if(_nccl_found_lib)
    set(NVFP4MOE_HAS_NCCL ON)
    get_filename_component(_nccl_libdir "${_nccl_found_lib}" DIRECTORY)
    target_include_directories(nvfp4moe SYSTEM PUBLIC "${_nccl_found_inc}")
    target_link_libraries(nvfp4moe PUBLIC "${_nccl_found_lib}")  # full path: no other libnccl can be picked
    # Kept by `cmake --install` (CMake rewrites only the RPATH it computed itself).
    target_link_options(nvfp4moe INTERFACE "LINKER:-rpath,${_nccl_libdir}")
    target_compile_definitions(nvfp4moe PUBLIC NVFP4MOE_HAS_NCCL=1)
  endif()
endif()

if(NVFP4MOE_HAS_NCCL)
  set(_nccl_line "ON: NCCL ${_nccl_version} (${_nccl_source}), ${_nccl_found_inc}, ${_nccl_found_lib}, RPATH set")
elseif(NOT NVFP4MOE_HAS_CUDA)
  set(_nccl_line "OFF (no CUDA backend)")
else()
  set(_nccl_line "OFF (no NCCL >= 2.28.7 with the device API; -DNCCL_ROOT=<dir with include/ and lib/>)")
endif()
if(_nccl_passed)
  string(REPLACE ";" "; " _nccl_passed "${_nccl_passed}")
  string(APPEND _nccl_line "; passed over: ${_nccl_passed}")
endif()
message(STATUS "nvfp4moe: NCCL expert parallelism ${_nccl_line}")
