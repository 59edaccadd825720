// The oneDNN CPU engine, per-thread streams and per-thread scratchpads that the engine's
// primitives share: the convolutions (conv_onednn.cpp) and the native bf16 products
// (gemm_lowp.cpp). Only in builds with oneDNN (CORTADO_HAVE_ONEDNN).
//
// Threads: the thread pool splits the work and each pool thread runs its own primitives, so
// oneDNN's OpenMP is held at one thread on every thread that calls in here, before the thread
// creates or runs a primitive (oneDNN sizes a primitive's parallel work when it is created, from
// the creating thread's OpenMP thread count).
#pragma once

#ifdef CORTADO_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>

namespace cortado::onednn {

// The CPU engine, created once with CORTADO_CPU_ISA's cap applied.
dnnl::engine& Engine();
// The calling thread's stream.
dnnl::stream& ThreadStream();
// The scratchpad of a primitive (made with scratchpad_mode::user) for the calling thread.
// oneDNN's own (library mode) is one buffer shared by every primitive of the process unless the
// library was built with DNNL_ENABLE_CONCURRENT_EXEC (Debian's is not): two threads running
// primitives at once would share it (for convolutions that corrupted about one forward in
// fifty). So every primitive takes its caller's: one per thread, grown to the largest asked for.
dnnl::memory ThreadScratchpad(const dnnl::memory::desc& desc);

}  // namespace cortado::onednn
#endif
