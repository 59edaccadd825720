// The engine's one thread budget. Compute (ParallelFor), BLAS and data-loader threads all draw
// from it so that a 2-core machine is never oversubscribed: BLAS is pinned to one thread and
// parallelism comes from ParallelFor splitting work across the pool.
//
// The budget is set once by the tool (--threads, else CORTADO_NUM_THREADS, else the core
// count). ParallelFor splits [0, n) into contiguous static chunks, one per thread, so results
// that depend on summation order are identical from run to run at a fixed thread count.
// Waiting threads spin about 30 microseconds before sleeping; CORTADO_SPIN=0 disables the spin
// (for machines whose cores other busy processes share).
#pragma once

#include <cstdint>
#include <functional>

namespace cortado {

// Sets the compute thread count (>= 1) and pins BLAS to one thread.
void SetNumThreads(int n);
int NumThreads();
// The budget from the environment: CORTADO_NUM_THREADS if set (validated), else the core count.
int DefaultNumThreads();

// Calls fn(begin, end) over contiguous chunks covering [0, n). Runs inline when n is small
// (fewer than min_chunk items per thread) or when called from inside a pool worker.
void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

// Runs fn(t) for t in [0, tasks) on the pool, one task per thread; tasks <= NumThreads().
void ParallelTasks(int tasks, const std::function<void(int)>& fn);

// Tests only: hook(worker) is called by each pool worker after it has taken a job and before it
// reads that job's task data, the window where a preempted worker once ran a task of the next
// job twice. A test sleeps there to make that interleaving happen; nullptr (the default) is off.
void SetWorkerHookForTesting(void (*hook)(int worker));

}  // namespace cortado
