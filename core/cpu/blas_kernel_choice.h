// OpenBLAS's kernel choice, and the correction normlab makes where OpenBLAS chooses wrongly.
// OpenBLAS's DYNAMIC_ARCH builds (Debian's) pick their kernels for the CPU once, when the library is
// loaded. On a CPU its table does not know (seen: a virtualized Xeon with AVX-512 that Debian's
// OpenBLAS 0.3.21 does not recognize) it falls back to Prescott's SSE3 kernels, which run sgemm about
// 4x slower than the AVX-512 kernels the same CPU can run (docs/benchmarks.md). OPENBLAS_CORETYPE,
// read at load time, overrides the choice; the `normlab` program sets it and restarts itself when
// blas_kernel_override() says so (examples/main.cpp). A program of your own that links normlab can do
// the same, or export OPENBLAS_CORETYPE before it starts.
#pragma once

namespace nl {

// The OPENBLAS_CORETYPE value this process should have been started with, or nullptr when nothing
// needs correcting: OpenBLAS is not on its Prescott fallback, or the CPU has neither AVX2 + FMA nor
// AVX-512, or OPENBLAS_CORETYPE is already set (a choice by the user or the machine's owner, which
// normlab never overrides). "SkylakeX" for AVX-512 F/BW/DQ/VL (OpenBLAS's AVX-512 sgemm), else "Haswell".
const char* blas_kernel_override();

// OpenBLAS's kernel name ("SkylakeX", "Haswell", "Prescott", ...).
const char* blas_kernel_name();

}  // namespace nl
