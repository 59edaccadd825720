# The CUDA backend's build switch: CORTADO_CUDA=AUTO (default) | ON | OFF.
#   AUTO: on where nvcc, the CUDA toolkit's libraries and cuDNN are found; off otherwise, with a
#         status line saying what is missing.
#   ON:   stop the configuration when any of them is missing.
#   OFF:  no CUDA at all (the build is the CPU engine alone, as before the backend existed).
# Sets CORTADO_HAVE_CUDA and enables the CUDA language. Device code targets sm_90 (H100/H200)
# as machine code plus compute_90 PTX, which newer GPUs compile at load time;
# CMAKE_CUDA_ARCHITECTURES overrides that.
set(CORTADO_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE CORTADO_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${CORTADO_CUDA}" _cortado_cuda)
if(NOT _cortado_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "CORTADO_CUDA='${CORTADO_CUDA}' is not one of AUTO, ON, OFF")
endif()

set(CORTADO_HAVE_CUDA OFF)
# The sanitizers instrument host code only and their flags are not nvcc's: a sanitizer build
# leaves the backend out under AUTO and refuses ON.
if(CORTADO_SANITIZE)
  if(_cortado_cuda STREQUAL "ON")
    message(FATAL_ERROR "CORTADO_CUDA=ON cannot be combined with CORTADO_SANITIZE")
  endif()
  message(STATUS "CUDA backend: off (sanitizer build)")
  set(_cortado_cuda OFF)
endif()
if(NOT _cortado_cuda STREQUAL "OFF")
  set(_cortado_cuda_missing "")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    list(APPEND _cortado_cuda_missing "nvcc")
  else()
    find_package(CUDAToolkit QUIET)
    if(NOT CUDAToolkit_FOUND)
      list(APPEND _cortado_cuda_missing "the CUDA toolkit's libraries")
    else()
      find_package(CUDNN QUIET)
      if(NOT CUDNN_FOUND)
        list(APPEND _cortado_cuda_missing "cuDNN (cudnn_version.h, libcudnn)")
      endif()
    endif()
  endif()
  if(_cortado_cuda_missing)
    list(JOIN _cortado_cuda_missing ", " _cortado_cuda_missing)
    if(_cortado_cuda STREQUAL "ON")
      message(FATAL_ERROR "CORTADO_CUDA=ON but ${_cortado_cuda_missing} not found "
                          "(set CUDNN_ROOT or CMAKE_CUDA_COMPILER, or build with CORTADO_CUDA=OFF)")
    endif()
    message(STATUS "CUDA backend: off (${_cortado_cuda_missing} not found)")
  else()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90-real 90-virtual)
    endif()
    # CMake 3.25 does not know nvcc 13's C++20 switch; nvcc has accepted -std=c++20 since 12.0.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION -std=c++20)
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION -std=c++20)
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    set(CMAKE_CUDA_EXTENSIONS OFF)
    set(CORTADO_HAVE_CUDA ON)
    message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, cuDNN "
                   "${CUDNN_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  endif()
endif()
