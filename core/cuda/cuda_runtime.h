// Entry points of the CUDA backend (core/cuda/*.cu), declared only when normlab is built with CUDA
// so the CPU build never references them.
#pragma once

#ifdef NORMLAB_HAVE_CUDA

#include "core/allocator.h"
#include "core/backend.h"

namespace nl {

// The counting allocator for CUDA device `index`; throws nl::Error when no such GPU is present.
Allocator& cuda_allocator(int index);
// The backend for CUDA device `index`; throws nl::Error when no such GPU is present.
Backend& cuda_backend(int index);

}  // namespace nl

#endif  // NORMLAB_HAVE_CUDA
