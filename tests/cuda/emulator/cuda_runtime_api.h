// The emulator's CUDA runtime (see emulator.h).
#pragma once
#include "cuda_runtime.h"
