// ActivationFile: one rank's scratch file for activations offloaded to disk (ZeRO-Infinity's
// idea, for the kept block inputs), memory-mapped, with slots reused every step and one I/O
// thread that does every copy in submission order. The file is unlinked as soon as it is
// created, so it goes with the process however the process ends (a SIGKILLed or OOM-killed
// run leaves no multi-GB file behind); its space is reserved with posix_fallocate at start-up,
// because a store through a mapping into a hole the disk cannot fill is a SIGBUS, not an error.
//
// Guarantees: write() and read() return at once; the copy runs on the I/O thread, which holds
// `keep` until it is done, so the caller may drop its own reference straight away. Completion
// is observed through the returned Ticket (wait(), or get() to rethrow the I/O thread's error).
// Operations complete in submission order, so a read of a slot sees every earlier write to it.
// Copies go through the mapping a chunk at a time and each chunk is dropped from this process's
// page tables after it (MADV_DONTNEED): the data stays in the page cache (dirty pages are
// written back by the kernel, started at once by sync_file_range), where it is evictable and
// not part of the process's RSS. No libtorch here.
#pragma once
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "longtrain/core/channel.h"

namespace lt::offload {

struct ActivationFileOptions {
  std::string dir;           // train.offload_dir; created if missing
  int rank = 0;              // names the file and the messages
  int64_t slotBytes = 0;     // bytes reserved per slot at start-up
  int slots = 0;             // slots reserved at start-up (more are added, and grown, on demand)
  int64_t chunkBytes = int64_t{4} << 20;  // mapped pages resident at once per copy
  std::string purpose;       // what the reservation is for, for the disk-full message
};

using Ticket = std::shared_future<void>;

class ActivationFile {
 public:
  // Creates the directory if needed, the file, reserves slots x slotBytes, maps it. Throws
  // lt::Error naming train.offload_dir for a directory that cannot be created or written, and
  // for a disk without the space (with the bytes needed and free).
  explicit ActivationFile(const ActivationFileOptions& o);
  ~ActivationFile();  // finishes the queued copies, then unmaps and closes (the file is gone)
  ActivationFile(const ActivationFile&) = delete;
  ActivationFile& operator=(const ActivationFile&) = delete;

  // Copies `bytes` from `src` into `slot` (growing it, or the file, if needed).
  Ticket write(int slot, const void* src, int64_t bytes, std::shared_ptr<const void> keep);
  // Copies `bytes` of `slot` (written earlier) into `dst`.
  Ticket read(int slot, void* dst, int64_t bytes, std::shared_ptr<const void> keep);

  const std::string& path() const { return path_; }  // as created (already unlinked)
  int64_t reservedBytes() const { return reserved_.load(); }
  int64_t allocatedBytes() const;  // disk blocks the file holds (fstat st_blocks)
  int64_t bytesWritten() const { return written_.load(); }
  int64_t bytesRead() const { return read_.load(); }
  double ioSeconds() const { return static_cast<double>(ioNanos_.load()) * 1e-9; }  // the I/O thread's copies

 private:
  struct Task {
    bool write = false;
    int slot = 0;
    void* ptr = nullptr;
    int64_t bytes = 0;
    std::shared_ptr<const void> keep;
    std::promise<void> done;
  };
  struct Slot {
    int64_t offset = 0, capacity = 0;
  };
  Ticket submit(Task t);
  void run();                        // the I/O thread
  void copy(Task& t);                // on the I/O thread
  Slot& slotFor(int slot, int64_t bytes);  // on the I/O thread: reserve more if needed
  void reserve(int64_t bytes);       // grow the file to `bytes` and remap it

  ActivationFileOptions opt_;
  std::string path_;
  int fd_ = -1;
  char* map_ = nullptr;
  int64_t mapped_ = 0;
  std::vector<Slot> slots_;  // touched by the I/O thread only (after construction)
  std::atomic<int64_t> reserved_{0}, written_{0}, read_{0}, ioNanos_{0};
  Channel<Task> queue_;
  std::thread thread_;
};

// Before any rank starts: the directory can be created and a file written in it (throws lt::Error
// naming train.offload_dir and the fix). Returns a warning when it lies in memory (tmpfs or
// ramfs: offloading there saves nothing), else "".
std::string checkOffloadDir(const std::string& dir);

}  // namespace lt::offload
