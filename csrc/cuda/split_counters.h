// Zeroing of the work split's arrival counters (split_counters.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kdtree::cuda {

// Zeroes the work split's arrival counters on `stream`, in a kernel that the next launch on the stream may
// overlap (programmatic dependent launch): the verify kernel waits for it before its first arrival.
void zero_split_counters(int* counters, int64_t count, cudaStream_t stream);

}  // namespace kdtree::cuda
