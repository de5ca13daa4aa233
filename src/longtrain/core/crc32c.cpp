#include "longtrain/core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace lt {

namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

std::array<uint32_t, 256> makeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (c & 1 ? kPoly : 0);
    t[i] = c;
  }
  return t;
}

uint32_t crcTable(const uint8_t* p, size_t n, uint32_t c) {
  static const auto table = makeTable();
  for (size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
// One stream, 8 bytes per instruction. Measured on the dev machine: 6.3 GB/s over 256 MiB
// against 8.7 GB/s for memcpy of the same buffer, well above the disk; interleaving
// streams (the instruction's latency is 3 cycles) would be the next step if it mattered.
__attribute__((target("sse4.2"))) uint32_t crcHw(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c64);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  static const bool hw = __builtin_cpu_supports("sse4.2");
  c = hw ? crcHw(p, n, c) : crcTable(p, n, c);
#else
  c = crcTable(p, n, c);
#endif
  return ~c;
}

}  // namespace lt
