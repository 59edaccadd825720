// StopSignals: SIGINT and SIGTERM as a flag that the training loop polls, received on a thread
// of its own.
//
// Why a thread of its own: a signal handler runs on the stack of whichever thread the kernel
// interrupts, and oneDNN's JIT GEMM kernels (libdnnl 2.6, the one Debian ships) keep data
// below the stack pointer beyond the red zone. A signal that lands while such a kernel runs
// overwrites that data, and the heap is corrupted (measured: about 1 Ctrl-C in 20 crashed a
// training with "corrupted size vs. prev_size"; a plain loop of dnnl_sgemm with a no-op handler
// crashes within seconds; delivered on another stack, never). So the constructor blocks both
// signals in the calling thread, which every thread started afterwards (compute pool, loader,
// communicators) inherits, and a watcher thread takes them with sigwait. Construct it before
// anything starts threads. Threads that libraries started earlier (OpenBLAS's idle pool) keep
// them unblocked, so the handler is installed too; it only sets the flag.
#pragma once

#include <atomic>
#include <thread>

namespace cortado::tools {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // True once SIGINT or SIGTERM has arrived.
  const std::atomic<bool>* flag() const;
  // The signal that arrived last (SIGINT or SIGTERM), 0 if none: a stopped command exits
  // with 128 + it.
  int signal() const;

 private:
  std::thread watcher_;
};

}  // namespace cortado::tools
