#include "longtrain/ckpt/safetensors.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "longtrain/config/json_text.h"
#include "longtrain/core/check.h"
#include "longtrain/core/files.h"
#include "longtrain/core/crc32c.h"

namespace lt::ckpt {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ------------------------------------------------------------------------------ AtomicFile
AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  LT_CHECK(fd_ >= 0, "cannot create '", tmp_, "': ", std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t n) {
  LT_ASSERT(fd_ >= 0, "write after commit");
  crc_ = crc32c(data, n, crc_);
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd_, p, std::min<size_t>(n, 1 << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == ENOSPC) {
      std::error_code ec;
      const auto space = fs::space(fs::path(tmp_).parent_path(), ec);
      LT_CHECK(false, "writing '", tmp_, "' failed: ", std::strerror(ENOSPC), " (the disk is full: ", n,
               " more bytes to write, ", ec ? 0 : space.available, " bytes free)");
    }
    LT_CHECK(w > 0, "writing '", tmp_, "' failed: ", std::strerror(errno), " (is the disk full?)");
    p += w;
    n -= static_cast<size_t>(w);
    bytes_ += w;
  }
}

void AtomicFile::commit(const std::function<void()>& beforeRename) {
  LT_ASSERT(fd_ >= 0, "commit twice");
  LT_CHECK(::fsync(fd_) == 0, "fsync of '", tmp_, "' failed: ", std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  if (beforeRename) beforeRename();
  LT_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "renaming '", tmp_, "' to '", path_,
           "' failed: ", std::strerror(errno));
  fsyncDirectory(fs::path(path_).parent_path().string());
}

void fsyncDirectory(const std::string& dir) {
  int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  LT_CHECK(fd >= 0, "cannot open directory '", dir, "': ", std::strerror(errno));
  int rc = ::fsync(fd);
  ::close(fd);
  LT_CHECK(rc == 0, "fsync of directory '", dir, "' failed: ", std::strerror(errno));
}

// ------------------------------------------------------------------------------ dtypes
namespace {

struct DtypeInfo {
  const char* name;
  at::ScalarType type;
  int size;
};
constexpr DtypeInfo kDtypes[] = {
    {"F32", at::kFloat, 4}, {"F64", at::kDouble, 8}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},  {"I32", at::kInt, 4},    {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},   {"BOOL", at::kBool, 1},
};

const DtypeInfo* dtypeByName(const std::string& n) {
  for (const auto& d : kDtypes)
    if (n == d.name) return &d;
  return nullptr;
}

const DtypeInfo& dtypeOf(at::ScalarType t) {
  for (const auto& d : kDtypes)
    if (d.type == t) return d;
  LT_CHECK(false, "safetensors: cannot store dtype ", c10::toString(t));
  __builtin_unreachable();
}

constexpr uint64_t kMaxHeader = 100u << 20;  // the format's own limit (100 MB)

}  // namespace

// ------------------------------------------------------------------------------ writing
FileDigest writeSafetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                            const std::map<std::string, std::string>& metadata,
                            const std::function<void()>& beforeRename) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  int64_t off = 0;
  for (const auto& nt : tensors) {
    LT_ASSERT(!h.contains(nt.name), "duplicate tensor name ", nt.name);
    auto t = nt.tensor.contiguous();
    const auto& d = dtypeOf(t.scalar_type());
    int64_t bytes = t.numel() * d.size;
    h[nt.name] = {{"dtype", d.name}, {"shape", t.sizes().vec()}, {"data_offsets", {off, off + bytes}}};
    off += bytes;
    data.push_back(std::move(t));
  }
  // nlohmann orders keys alphabetically; the data section stays in the given order.
  std::string hs = h.dump();
  hs.append((8 - hs.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  uint64_t n = hs.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  AtomicFile f(path);
  f.write(len, 8);
  f.write(hs.data(), hs.size());
  for (const auto& t : data) f.write(t.data_ptr(), static_cast<size_t>(t.numel()) * t.element_size());
  f.commit(beforeRename);
  return {f.bytes(), f.crc()};
}

// ------------------------------------------------------------------------------ reading
SafetensorsHeader parseSafetensors(const uint8_t* data, size_t size, const std::string& what) {
  LT_CHECK(size >= 8, what, ": not a safetensors file: ", size, " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(data[i]) << (8 * i);
  LT_CHECK(n <= kMaxHeader && n <= size - 8, what, ": header length ", n, " does not fit the file (",
           size, " bytes); the file is truncated or not safetensors");
  json h;
  config::checkJsonDepth(std::string(reinterpret_cast<const char*>(data) + 8, n), what + ": header");
  try {
    h = json::parse(data + 8, data + 8 + n);
  } catch (const std::exception& e) {
    LT_CHECK(false, what, ": header is not valid JSON: ", e.what());
  }
  LT_CHECK(h.is_object(), what, ": header is not a JSON object");
  SafetensorsHeader out;
  out.dataOffset = static_cast<int64_t>(8 + n);
  const uint64_t dataBytes = size - 8 - n;
  for (auto it = h.begin(); it != h.end(); ++it) {
    const auto& v = it.value();
    if (it.key() == "__metadata__") {
      LT_CHECK(v.is_object(), what, ": __metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        LT_CHECK(m.value().is_string(), what, ": __metadata__.", m.key(), " is not a string");
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string& name = it.key();
    LT_CHECK(v.is_object() && v.size() == 3 && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
             what, ": tensor '", name, "' must have exactly dtype, shape and data_offsets");
    LT_CHECK(v["dtype"].is_string(), what, ": tensor '", name, "': dtype is not a string");
    TensorEntry e;
    e.name = name;
    e.dtype = v["dtype"].get<std::string>();
    const DtypeInfo* d = dtypeByName(e.dtype);
    LT_CHECK(d, what, ": tensor '", name, "': unknown dtype '", e.dtype, "'");
    LT_CHECK(v["shape"].is_array(), what, ": tensor '", name, "': shape is not an array");
    uint64_t numel = 1;
    for (const auto& s : v["shape"]) {
      LT_CHECK(s.is_number_unsigned(), what, ": tensor '", name, "': shape has a non-integer or negative entry");
      uint64_t k = s.get<uint64_t>();
      LT_CHECK(k == 0 || numel <= dataBytes / k, what, ": tensor '", name, "': shape is larger than the file");
      numel *= k;
      e.shape.push_back(static_cast<int64_t>(k));
    }
    const auto& o = v["data_offsets"];
    LT_CHECK(o.is_array() && o.size() == 2 && o[0].is_number_unsigned() && o[1].is_number_unsigned(), what,
             ": tensor '", name, "': data_offsets must be two non-negative integers");
    uint64_t b = o[0].get<uint64_t>(), en = o[1].get<uint64_t>();
    LT_CHECK(b <= en && en <= dataBytes, what, ": tensor '", name, "': data_offsets [", b, ", ", en,
             "] lie outside the data section (", dataBytes, " bytes); the file is truncated or corrupt");
    LT_CHECK(en - b == numel * d->size, what, ": tensor '", name, "': ", en - b, " bytes for ", numel, " x ",
             e.dtype, " (", numel * d->size, " bytes)");
    e.begin = static_cast<int64_t>(b);
    e.end = static_cast<int64_t>(en);
    out.tensors.push_back(std::move(e));
  }
  std::sort(out.tensors.begin(), out.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  int64_t at = 0;
  for (const auto& e : out.tensors) {
    LT_CHECK(e.begin == at, what, ": tensor '", e.name, "' starts at byte ", e.begin, " of the data section, expected ",
             at, " (tensors overlap or leave a gap)");
    at = e.end;
  }
  LT_CHECK(static_cast<uint64_t>(at) == dataBytes, what, ": the data section has ", dataBytes,
           " bytes but its tensors cover ", at, " (trailing bytes or truncation)");
  return out;
}

SafetensorsFile::SafetensorsFile(const std::string& path, const std::function<void(const uint8_t*, size_t)>& verify)
    : path_(path) {
  int fd = openInputFile(path, "'" + path + "'");
  struct stat st{};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    LT_CHECK(false, "cannot stat '", path, "': ", std::strerror(errno));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    // MAP_POPULATE reads the file in at once instead of one page fault per 4 KiB page.
    void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    ::close(fd);
    LT_CHECK(m != MAP_FAILED, "cannot map '", path, "': ", std::strerror(errno));
    map_ = static_cast<const uint8_t*>(m);
  } else {
    ::close(fd);
  }
  try {
    if (verify) verify(map_, size_);
    header_ = parseSafetensors(map_, size_, "'" + path + "'");
  } catch (...) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
    throw;
  }
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_[header_.tensors[i].name] = i;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), size_);
}

const TensorEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.tensors[it->second];
}

at::Tensor SafetensorsFile::view(const std::string& name) const {
  const TensorEntry* e = find(name);
  LT_CHECK(e, "'", path_, "' has no tensor '", name, "'");
  const DtypeInfo* d = dtypeByName(e->dtype);
  void* p = const_cast<uint8_t*>(map_ + header_.dataOffset + e->begin);
  return at::from_blob(p, e->shape, at::TensorOptions().dtype(d->type));
}

}  // namespace lt::ckpt
