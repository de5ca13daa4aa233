// The bytes activation offload holds in this process, declared beside the code (activation_file.cpp)
// for `longtrain plan`. Non-obvious: the file's pages are not counted (they are page cache, out of
// the process's page tables after each chunk); only the chunk a running copy has mapped is.
#pragma once
#include "longtrain/core/footprint.h"

namespace lt::offload {

// While a write or a read of a `tensorBytes` tensor runs: the mapped pages of one chunk
// (ActivationFileOptions::chunkBytes at its default).
TensorBytes copyFootprint(double tensorBytes);

}  // namespace lt::offload
