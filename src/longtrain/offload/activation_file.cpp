// ActivationFile: the mapping, the reservation and the I/O thread. A slot that must grow gets a
// new region at the end of the file (the old one is abandoned, not moved): growth happens only
// when a tensor is larger than what start-up reserved, so the waste is bounded by one slot.
#include "longtrain/offload/activation_file.h"
#include "longtrain/offload/footprint.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "longtrain/core/check.h"

namespace lt::offload {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kPage = 4096;

int64_t roundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

std::string mib1(int64_t b) {  // one decimal
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", mib(b));
  return s;
}

// Creates `dir` if needed and a new file in it, already unlinked; returns its descriptor.
int createUnlinked(const std::string& dir, int rank, std::string* path) {
  std::error_code ec;
  LT_CHECK(!fs::exists(dir, ec) || fs::is_directory(dir, ec), "train.offload_dir='", dir,
           "' is not a directory; give a directory (created if missing)");
  fs::create_directories(dir, ec);
  LT_CHECK(!ec, "train.offload_dir='", dir, "' cannot be created: ", ec.message(),
           "; choose a directory this user can write (each rank keeps its offloaded activations in a file there)");
  std::string tmpl = (fs::path(dir) / ("longtrain-activations-rank" + std::to_string(rank) + "-XXXXXX")).string();
  const int fd = ::mkostemp(tmpl.data(), O_CLOEXEC);
  const int err = errno;
  LT_CHECK(fd >= 0, "train.offload_dir='", dir, "' is not writable: ", std::strerror(err),
           "; fix its permissions or mount, or choose another directory (found at start-up, before any step)");
  ::unlink(tmpl.c_str());  // the file lives as long as the descriptor: nothing is left behind
  *path = tmpl;
  return fd;
}

}  // namespace

std::string checkOffloadDir(const std::string& dir) {
  std::string path;
  ::close(createUnlinked(dir, -1, &path));
  struct statfs s {};
  if (::statfs(dir.c_str(), &s) == 0 && (s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC))
    return "train.offload_dir='" + dir + "' is on " + (s.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs") +
           ", which is memory: offloading there saves no memory; choose a directory on a disk";
  return "";
}

ActivationFile::ActivationFile(const ActivationFileOptions& o) : opt_(o) {
  LT_ASSERT(o.slotBytes >= 0 && o.slots >= 0 && o.chunkBytes >= kPage && o.chunkBytes % kPage == 0);
  fd_ = createUnlinked(o.dir, o.rank, &path_);
  const int64_t slot = roundUp(o.slotBytes, kPage);
  try {
    reserve(slot * o.slots);
  } catch (...) {
    ::close(fd_);
    throw;
  }
  for (int i = 0; i < o.slots; ++i) slots_.push_back({i * slot, slot});
  thread_ = std::thread([this] { run(); });
}

ActivationFile::~ActivationFile() {
  queue_.close();
  if (thread_.joinable()) thread_.join();
  if (map_) ::munmap(map_, static_cast<size_t>(mapped_));
  if (fd_ >= 0) ::close(fd_);
}

void ActivationFile::reserve(int64_t bytes) {
  if (bytes <= mapped_) return;
  // Blocks are allocated now: a store through the mapping can then never meet a full disk.
  if (const int err = ::posix_fallocate(fd_, 0, bytes); err != 0) {
    struct statvfs v {};
    const bool known = ::fstatvfs(fd_, &v) == 0;
    LT_CHECK(false, "train.offload_dir='", opt_.dir, "': reserving ", mib1(bytes), " MiB for rank ", opt_.rank,
             "'s offloaded activations", opt_.purpose.empty() ? "" : " (" + opt_.purpose + ")", " failed: ",
             std::strerror(err),
             known ? "; the disk has " + mib1(static_cast<int64_t>(v.f_bavail * v.f_frsize)) + " MiB free" : "",
             err == ENOSPC ? "; free space there, choose a larger disk, or lower data.seq_len" : "",
             " (found at start-up, before any step)");
  }
  void* m = map_ ? ::mremap(map_, static_cast<size_t>(mapped_), static_cast<size_t>(bytes), MREMAP_MAYMOVE)
                 : ::mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  const int err = errno;
  LT_CHECK(m != MAP_FAILED, "train.offload_dir='", opt_.dir, "': mapping ", mib(bytes), " MiB of ", path_,
           " failed: ", std::strerror(err));
  map_ = static_cast<char*>(m);
  mapped_ = bytes;
  reserved_.store(bytes);
}

int64_t ActivationFile::allocatedBytes() const {
  struct stat st {};
  return ::fstat(fd_, &st) == 0 ? static_cast<int64_t>(st.st_blocks) * 512 : -1;
}

Ticket ActivationFile::write(int slot, const void* src, int64_t bytes, std::shared_ptr<const void> keep) {
  Task t;
  t.write = true;
  t.slot = slot;
  t.ptr = const_cast<void*>(src);
  t.bytes = bytes;
  t.keep = std::move(keep);
  return submit(std::move(t));
}

Ticket ActivationFile::read(int slot, void* dst, int64_t bytes, std::shared_ptr<const void> keep) {
  Task t;
  t.slot = slot;
  t.ptr = dst;
  t.bytes = bytes;
  t.keep = std::move(keep);
  return submit(std::move(t));
}

Ticket ActivationFile::submit(Task t) {
  LT_ASSERT(t.slot >= 0 && t.bytes >= 0);
  Ticket done = t.done.get_future().share();
  LT_ASSERT(queue_.push(std::move(t)), "activation file used after close");
  return done;
}

void ActivationFile::run() {
  while (auto t = queue_.pop()) {
    std::exception_ptr error;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      copy(*t);
    } catch (...) {
      error = std::current_exception();
    }
    ioNanos_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
    t->keep.reset();  // before completion: a finished write no longer holds its tensor
    if (error) t->done.set_exception(error);
    else t->done.set_value();
  }
}

ActivationFile::Slot& ActivationFile::slotFor(int slot, int64_t bytes) {
  if (slot >= static_cast<int>(slots_.size())) slots_.resize(slot + 1);
  Slot& s = slots_[slot];
  if (s.capacity < bytes) {  // a new region at the end of the file
    s.offset = mapped_;
    s.capacity = roundUp(bytes, kPage);
    reserve(s.offset + s.capacity);
  }
  return s;
}

void ActivationFile::copy(Task& t) {
  if (t.bytes == 0) return;
  Slot* s;
  if (t.write) {
    s = &slotFor(t.slot, t.bytes);
  } else {
    LT_ASSERT(t.slot < static_cast<int>(slots_.size()) && slots_[t.slot].capacity >= t.bytes,
              "read of slot ", t.slot, " before a write of ", t.bytes, " bytes");
    s = &slots_[t.slot];
    ::madvise(map_ + s->offset, static_cast<size_t>(roundUp(t.bytes, kPage)), MADV_WILLNEED);  // read ahead
  }
  char* mem = static_cast<char*>(t.ptr);
  for (int64_t off = 0; off < t.bytes; off += opt_.chunkBytes) {
    const int64_t n = std::min(opt_.chunkBytes, t.bytes - off);
    char* file = map_ + s->offset + off;
    if (t.write) std::memcpy(file, mem + off, static_cast<size_t>(n));
    else std::memcpy(mem + off, file, static_cast<size_t>(n));
    // Out of this process's page tables; a dirty page stays dirty in the page cache.
    ::madvise(file, static_cast<size_t>(roundUp(n, kPage)), MADV_DONTNEED);
  }
  if (t.write) {
    ::sync_file_range(fd_, s->offset, t.bytes, SYNC_FILE_RANGE_WRITE);  // start the write-back, do not wait
    written_ += t.bytes;
  } else {
    read_ += t.bytes;
  }
}

TensorBytes copyFootprint(double tensorBytes) {
  TensorBytes t;
  t.add(1, std::min(tensorBytes, static_cast<double>(ActivationFileOptions{}.chunkBytes)));
  return t;
}

}  // namespace lt::offload
