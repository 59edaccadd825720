# Enables CUDA where nvcc and the toolkit's libraries are found, for the communication library
# (its codecs on a GPU) and, through cmake/CortadoCuda.cmake, for the whole engine. Sets
#   CORTADO_CUDA_LANGUAGE       ON when CUDA is enabled, with the CUDA::* targets defined
#   CORTADO_CUDA_LANGUAGE_WHY   what is missing when it is not
# Device code targets sm_90 (H100/H200) as machine code plus compute_90 PTX, which newer GPUs
# compile at load time; CMAKE_CUDA_ARCHITECTURES overrides that. Sanitizer builds leave CUDA out
# (their flags are not nvcc's).
set(CORTADO_CUDA_LANGUAGE OFF)
set(CORTADO_CUDA_LANGUAGE_WHY "")
if(CORTADO_SANITIZE)
  set(CORTADO_CUDA_LANGUAGE_WHY "sanitizer build")
else()
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    set(CORTADO_CUDA_LANGUAGE_WHY "nvcc not found")
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
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      set(CORTADO_CUDA_LANGUAGE ON)
    else()
      set(CORTADO_CUDA_LANGUAGE_WHY "the CUDA toolkit's libraries not found")
    endif()
  endif()
endif()
