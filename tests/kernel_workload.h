// A small workload that reaches every row of the kernel table (core/kernels.def) on a device, and the
// check that it did: tests/test_profiler.cpp runs it on the CPU, tests/test_cuda.cpp on a GPU, so a
// kernel row that one backend's ops never reach fails a test.
#pragma once

#include <functional>

#include "core/device.h"

namespace nl::test {

void kernel_table_workload(Device device);
void require_every_kernel_called(const std::function<void()>& workload);

}  // namespace nl::test
