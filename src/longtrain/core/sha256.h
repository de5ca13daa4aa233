// SHA-256 (FIPS 180-4), for the digests longtrain records of the files a run depends on (the
// tokenizer a token file was written with). Non-obvious: files are hashed streaming, in 1 MiB
// reads, so a multi-gigabyte file costs no memory.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace lt {

class Sha256 {
 public:
  Sha256();
  void update(std::string_view bytes);
  std::string hexDigest();  // finishes the hash; 64 lowercase hex digits

 private:
  void block(const unsigned char* p);
  uint32_t h_[8];
  unsigned char buffer_[64];
  size_t buffered_ = 0;
  uint64_t length_ = 0;  // bytes so far
};

std::string sha256Hex(std::string_view bytes);
std::string sha256File(const std::string& path);  // lt::Error naming the path if unreadable

}  // namespace lt
