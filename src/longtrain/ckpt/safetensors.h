// The safetensors format (Hugging Face): 8 bytes little-endian header length N, N bytes of
// JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data section; offsets are relative to it, little-endian, C order.
// Files are written atomically (AtomicFile): to `<path>.tmp`, fsynced, renamed over `path`,
// and the directory fsynced, so a crash leaves either the old file or the new one, never
// half of one. The CRC-32C of the bytes written is computed on the way.
// Reading maps the file and validates the header strictly (every offset inside the data
// section, sizes equal to dtype x shape, no overlap, no gap, nothing after the last tensor):
// a malformed file is an lt::Error naming the file and what is wrong, never a crash.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace lt::ckpt {

// A file being written under `<path>.tmp`; commit() makes it `path`. Destroyed without
// commit(), it removes the temporary file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t n);
  // fsync, close, rename to the final name, fsync the directory. `beforeRename` runs after
  // the fsync and before the rename (the crash-injection point of the tests).
  void commit(const std::function<void()>& beforeRename = {});
  int64_t bytes() const { return bytes_; }
  uint32_t crc() const { return crc_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

void fsyncDirectory(const std::string& dir);

struct NamedTensor {
  std::string name;
  at::Tensor tensor;  // any layout; written contiguous
};

struct FileDigest {
  int64_t bytes = 0;
  uint32_t crc32c = 0;
};

// Writes tensors (in the given order) and string metadata as one safetensors file, atomically.
FileDigest writeSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                            const std::map<std::string, std::string>& metadata,
                            const std::function<void()>& beforeRename = {});

struct TensorEntry {
  std::string name, dtype;  // dtype: "F32", "F64", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL"
  std::vector<int64_t> shape;
  int64_t begin = 0, end = 0;  // byte offsets in the data section
};

struct SafetensorsHeader {
  std::vector<TensorEntry> tensors;  // in data order
  std::map<std::string, std::string> metadata;
  int64_t dataOffset = 0;  // 8 + header length
};

// Parses and validates the header of a whole file image of `size` bytes; `what` names the
// file in errors. Throws lt::Error on anything malformed.
SafetensorsHeader parseSafetensors(const uint8_t* data, size_t size, const std::string& what);

// A safetensors file mapped read-only.
class SafetensorsFile {
 public:
  // `verify`, if given, sees the whole file image before the header is parsed (the
  // checkpoint reader checks its CRC there, so a corrupt file is reported as such).
  explicit SafetensorsFile(const std::string& path,
                           const std::function<void(const uint8_t* data, size_t size)>& verify = {});
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const SafetensorsHeader& header() const { return header_; }
  const TensorEntry* find(const std::string& name) const;  // nullptr if absent
  // A tensor aliasing the mapping (valid while this object lives); copy it to keep it.
  at::Tensor view(const std::string& name) const;
  const uint8_t* data() const { return map_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t size_ = 0;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;
};

}  // namespace lt::ckpt
