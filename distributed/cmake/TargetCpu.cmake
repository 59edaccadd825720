# CORTADO_NATIVE and CORTADO_MARCH: which CPU the C++ code is compiled for. Shared by the
# Cortado build and the communication library built alone.
#   CORTADO_NATIVE=ON (default): -march=${CORTADO_MARCH}, which is `native` (this machine's
#     CPU) unless set, e.g. CORTADO_MARCH=x86-64-v3 for a build that runs, and rounds, as on a
#     machine with AVX2, FMA and F16C but no AVX-512 (scripts/test.sh's forced-AVX2 stage: the
#     `omp simd` reductions of the layers sum in the vector width the build targets).
#   CORTADO_NATIVE=OFF: no -march at all (a portable x86-64 binary; the codecs still pick their
#     AVX2 or AVX-512 kernels at run time).
# Kernels chosen at run time (oneDNN's, the codecs') follow CORTADO_CPU_ISA instead.
option(CORTADO_NATIVE "Optimize for one CPU (-march=CORTADO_MARCH, default native)" ON)
set(CORTADO_MARCH "native" CACHE STRING "The -march value when CORTADO_NATIVE is ON")
if(CORTADO_NATIVE)
  include(CheckCXXCompilerFlag)
  string(MAKE_C_IDENTIFIER "CORTADO_HAS_MARCH_${CORTADO_MARCH}" _cortado_march_check)
  check_cxx_compiler_flag(-march=${CORTADO_MARCH} ${_cortado_march_check})
  if(${_cortado_march_check})
    add_compile_options($<$<COMPILE_LANGUAGE:CXX>:-march=${CORTADO_MARCH}>)
  elseif(NOT CORTADO_MARCH STREQUAL "native")
    message(FATAL_ERROR "CORTADO_MARCH='${CORTADO_MARCH}': the compiler refuses -march=${CORTADO_MARCH}")
  endif()
endif()
