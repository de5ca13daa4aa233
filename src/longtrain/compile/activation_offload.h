// ActivationOffload: the executor's side of OffloadActivation / ReloadActivation when
// train.offload_dir is set: a kept block input goes to the rank's ActivationFile (slot = block)
// after its forward and comes back into a fresh tensor before its backward. At most one write
// is in flight: offloading block b first waits for block b-1's write, so the memory a slow disk
// can hold up is one block input, not all of them (the memory model counts it), and the wait
// only happens when the disk is slower than a block's forward.
// Ownership: offload() takes a reference to the tensor and the I/O thread drops it once the
// bytes are in the file; the caller drops its own at once. prefetch() starts the read into a
// tensor this object holds until take() hands it over. Bytes round-trip exactly.
#pragma once
#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "longtrain/offload/activation_file.h"

namespace lt::compile {

class ActivationOffload {
 public:
  // `slotBytes` x `slots`: what start-up reserves (the expected block input, the offloaded
  // blocks); other sizes work, growing the file. Throws lt::Error for a bad directory or a full disk.
  ActivationOffload(const std::string& dir, int rank, int64_t slotBytes, int slots, const std::string& purpose = "");

  void offload(int block, const at::Tensor& x);  // after Forward(block): x is its input
  void prefetch(int block);                      // start reading it back (ReloadActivation)
  at::Tensor take(int block);                    // wait for it (reading it now if not prefetched)
  bool holds(int block) const;                   // offloaded and not yet taken
  // Forgets every block (a micro-step that threw leaves some held): waits for the copies in
  // flight, ignoring their errors. The file and its slots stay.
  void reset();

  int64_t residentBytes() const;   // in memory: inputs still being written, reads not yet taken
  int64_t offloadedBytes() const;  // held in the file for a later take()
  // Seconds the caller was blocked in offload() (a slow previous write) and take() (a read not
  // finished ahead): the I/O the overlap did not hide. Cumulative.
  double waitSeconds() const { return waitSeconds_; }
  const offload::ActivationFile& file() const { return file_; }

 private:
  struct Entry {
    bool held = false;
    std::vector<int64_t> sizes;
    at::ScalarType dtype{};
    int64_t bytes = 0;
    offload::Ticket written, read;
    at::Tensor buffer;  // the read's destination, until take()
  };
  Entry& entry(int block);

  offload::ActivationFile file_;
  std::vector<Entry> entries_;  // by block
  offload::Ticket lastWrite_;
  double waitSeconds_ = 0;
};

}  // namespace lt::compile
