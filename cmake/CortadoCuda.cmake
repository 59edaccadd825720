# The CUDA backend's build switch: CORTADO_CUDA=AUTO (default) | ON | OFF.
#   AUTO: on where nvcc, the CUDA toolkit's libraries and cuDNN are found; off otherwise, with a
#         status line saying what is missing.
#   ON:   stop the configuration when any of them is missing.
#   OFF:  no CUDA at all (the build is the CPU engine alone, as before the backend existed).
# Sets CORTADO_HAVE_CUDA. Finding nvcc and enabling the language is the communication library's
# distributed/cmake/CudaLanguage.cmake (its codecs run on GPUs too); cuDNN is the engine's own.
set(CORTADO_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO, ON or OFF")
set_property(CACHE CORTADO_CUDA PROPERTY STRINGS AUTO ON OFF)
string(TOUPPER "${CORTADO_CUDA}" _cortado_cuda)
if(NOT _cortado_cuda MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "CORTADO_CUDA='${CORTADO_CUDA}' is not one of AUTO, ON, OFF")
endif()
if(_cortado_cuda STREQUAL "ON" AND CORTADO_SANITIZE)
  message(FATAL_ERROR "CORTADO_CUDA=ON cannot be combined with CORTADO_SANITIZE")
endif()

set(CORTADO_HAVE_CUDA OFF)
if(_cortado_cuda STREQUAL "OFF")
  set(CORTADO_CUDA_LANGUAGE OFF)
else()
  include(${PROJECT_SOURCE_DIR}/distributed/cmake/CudaLanguage.cmake)
  set(_cortado_cuda_missing "${CORTADO_CUDA_LANGUAGE_WHY}")
  if(CORTADO_CUDA_LANGUAGE)
    find_package(CUDNN QUIET)
    if(NOT CUDNN_FOUND)
      set(_cortado_cuda_missing "cuDNN (cudnn_version.h, libcudnn) not found")
    endif()
  endif()
  if(_cortado_cuda_missing)
    if(_cortado_cuda STREQUAL "ON")
      message(FATAL_ERROR "CORTADO_CUDA=ON but ${_cortado_cuda_missing} "
                          "(set CUDNN_ROOT or CMAKE_CUDA_COMPILER, or build with CORTADO_CUDA=OFF)")
    endif()
    message(STATUS "CUDA backend: off (${_cortado_cuda_missing})")
  else()
    set(CORTADO_HAVE_CUDA ON)
    message(STATUS "CUDA backend: on (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, cuDNN "
                   "${CUDNN_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES})")
  endif()
endif()
