#!/usr/bin/env bash
# Sets up, builds and runs every test (what CI runs), in four stages:
#   1. format: every C++ file follows .clang-format (scripts/check_format.sh), and engine/'s
#      rooms include one way (scripts/check_rooms.sh);
#   2. the whole project (Release, into build/) and the communication library on its own
#      (build/distributed-alone/, which proves it links alone): every test, including the
#      bounded runs of the fuzz targets (tests/fuzz/);
#   3. ASan + UBSan at forced AVX2 (build/asan/, -O1): the project built for x86-64-v3 (AVX2,
#      FMA, F16C; no AVX-512) and every test run again, any report fatal, with the kernels
#      chosen at run time capped at AVX2 (CORTADO_CPU_ISA), so a machine with AVX-512 also
#      proves what one without it computes (the codecs' tests still run every kernel set the
#      CPU has: they pick them by name, not by the cap);
#   4. TSan (build/tsan/, -O1): the thread pool, the batch loader and LMDB sources, two
#      data-parallel ranks training as threads (overlap and synchronized batch norm; and on test
#      devices, whose stream threads copy buckets out while the communicator reduces), and the
#      communication library (its MPI backend aside: Open MPI is not instrumented).
# Warnings are errors in every build (CORTADO_WERROR).
#   scripts/test.sh [--no-sanitize]     --no-sanitize: stage 1, 2 and a forced-AVX2 Release
#                                       build (build/avx2/) with every test (a quick local run)
set -euo pipefail
cd "$(dirname "$0")/.."

sanitize=1
for arg in "$@"; do
  case "$arg" in
    --no-sanitize) sanitize=0 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "test.sh: unknown option '$arg' (known: --no-sanitize)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh
jobs=${CORTADO_BUILD_JOBS:-2}
stage_start=$SECONDS
stage() {
  echo "== $1 (at $((SECONDS - stage_start)) s)"
}

# build DIR SOURCE [cmake options...] [-- targets...]
build() {
  local dir=$1 src=$2
  shift 2
  local options=() targets=()
  while (($#)); do
    if [[ $1 == -- ]]; then
      shift
      targets=("$@")
      break
    fi
    options+=("$1")
    shift
  done
  cmake -S "$src" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DCORTADO_WERROR=ON "${options[@]}" >/dev/null
  if ((${#targets[@]})); then
    cmake --build "$dir" -j"$jobs" --target "${targets[@]}"
  else
    cmake --build "$dir" -j"$jobs"
  fi
}

stage "format"
scripts/check_format.sh
scripts/check_rooms.sh

stage "build (build/, build/distributed-alone/)"
build build . -DCORTADO_DIST_TESTS=OFF  # the distributed suites build and run stand-alone
# Built for any x86-64 (no -march=native): the codecs' AVX2 and AVX-512 kernels must compile by
# their own target attributes, as in a portable binary, and still run where the CPU has them.
build build/distributed-alone distributed -DCORTADO_NATIVE=OFF

stage "tests"
# The distributed suites run once, in the stand-alone build; everything else in build/.
ctest --test-dir build --output-on-failure -j"$jobs" --timeout 600
ctest --test-dir build/distributed-alone --output-on-failure -j"$jobs" --timeout 600

# What a CPU without AVX-512 computes, on any machine: the compiler's vectors at AVX2's width
# (the layers' `omp simd` reductions: -march=x86-64-v3, which the -O1 of the sanitizer build
# vectorizes too), and at run time oneDNN's, the codecs' and the bf16 products' kernels capped at
# AVX2 (CORTADO_CPU_ISA), OpenBLAS's too (read when it loads). With the sanitizers this is their
# build (one build and one run of the suite instead of two); without them, a Release build. The
# CUDA backend is left out of both: its code does not depend on the host's vector width.
avx2_march=-DCORTADO_MARCH=x86-64-v3
forced_avx2() { CORTADO_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell "$@"; }
if ((!sanitize)); then
  stage "forced AVX2 build (build/avx2/)"
  build build/avx2 . -DCORTADO_DIST_TESTS=OFF "$avx2_march" -DCORTADO_CUDA=OFF
  stage "forced AVX2 tests"
  forced_avx2 ctest --test-dir build/avx2 --output-on-failure -j"$jobs" --timeout 600
fi

if ((sanitize)); then
  # Every report stops the test that caused it; the process tests' children inherit these.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/tsan.supp
  # The collective matrix's large count: 2^18 + 3 here (1 MB of f32: past the 512 KB where the
  # ring takes over, 32 of the direct all-reduce's blocks) instead of 2^20 + 3, whose reference
  # arithmetic is most of the sanitizer stages' time. Release runs the full one.
  export CORTADO_TEST_LARGE_COUNT=$(((1 << 18) + 3))

  stage "ASan + UBSan build at forced AVX2 (build/asan/)"
  build build/asan . -DCORTADO_SANITIZE=address,undefined "$avx2_march"
  stage "ASan + UBSan tests at forced AVX2 (the communication library's included)"
  # Open MPI leaks at MPI_Finalize (its own allocations and its plugins'): the tests that run
  # under mpirun skip LeakSanitizer, every other one has it.
  mpi_tests='^distributed\.mpi\.|Mpirun'
  forced_avx2 ctest --test-dir build/asan --output-on-failure -j"$jobs" --timeout 900 -E "$mpi_tests"
  ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 forced_avx2 \
    ctest --test-dir build/asan --output-on-failure -j"$jobs" --timeout 900 -R "$mpi_tests"

  stage "TSan build (build/tsan/)"
  build build/tsan . -DCORTADO_SANITIZE=thread -- test_concurrency cortado_distributed_tests dist_test_worker
  stage "TSan tests"
  # UCX (linked when libucx is found) is not instrumented, and its memory hooks (ucm, patching
  # mmap/munmap to keep its registration cache valid) crash TSan-instrumented processes, even
  # in tests that never use UCX. Without them (UCX_MEM_EVENTS=no; the processes the tests start
  # inherit it) the UCX cases run under TSan with no report; its registration cache only
  # matters for RDMA memory, which these tests do not use.
  export UCX_MEM_EVENTS=no
  build/tsan/tests/test_concurrency \
    --gtest_filter='ThreadPool.*:Loader.*:LmdbSourceTest.*:CorruptRecordsTest.*:DetectionSourceTest.*:DataParallelThreads.*:DataParallelOnDevice.TwoRanks*'
  # Without the MPI backend's tests: inside Open MPI, whose threads TSan cannot see, it
  # reports lock-order inversions of Open MPI's own (mca_btl_tcp_add_procs).
  # Also without the single-threaded codec kernel sweep (nothing for TSan to see, and past its
  # 180 s limit at TSan's speed) and the 5-rank process collectives, whose deadline a loaded
  # 2-core machine missed under TSan on a clean-clone run; 1-4 ranks run.
  # (ctest's names of parameterized tests end in "  # GetParam() = ...", hence "( |$)".)
  ctest --test-dir build/tsan --output-on-failure -j"$jobs" --timeout 900 -L distributed \
    -E "$mpi_tests|CodecSweep|CollectivesProcesses[^ ]*_5( |\$)"
fi
stage "all tests passed"
