// Communicator over c10d's ProcessGroupGloo. Guarantees:
// - Every collective is asynchronous and returns a Work handle; nothing is complete until
//   wait() returns. Tensors passed in must stay alive and untouched until then.
// - allReduce and broadcast are in place; allGather/reduceScatter/allToAll write `out`.
// - Every collective is bounded by Options::timeout. A failure (a dead or silent peer)
//   throws lt::Error from wait() naming the collective, the group and the lost world
//   rank(s) as told by the heartbeat (see Liveness). Never a hang.
// - Gloo in libtorch 1.13 lacks reduce_scatter: it is alltoall_base plus a local sum,
//   the same bytes on the wire as a ring reduce-scatter.
// - A large sum all-reduce on 2 ranks runs as concurrent all-reduces of contiguous pieces
//   (Options::allReducePieces): one Gloo ring keeps only two 1 MiB segments in flight and
//   idles the link between them; a small one runs as one exchange (Options::allReduceExchange).
//   The result is bit-identical: each element is a + b either way.
#pragma once
#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace c10d {
class Store;
class ProcessGroupGloo;
class Work;
}  // namespace c10d

namespace lt::comm {

using Millis = std::chrono::milliseconds;

struct Options {
  Millis timeout{60000};
  std::string hostname{"127.0.0.1"};  // the address Gloo binds to (comm/binding.h picks it) ...
  std::vector<std::string> interfaces;  // ... unless these interfaces are named (GLOO_SOCKET_IFNAME)
  // A sum all-reduce of at least allReduceSplitBytes on a 2-rank group runs as this many
  // concurrent pieces (each a Gloo collective of its own, on its own Gloo worker thread); 1:
  // never split. Only 2-rank sums: with more ranks Gloo's ring sums an element in an order
  // that depends on where the piece boundaries fall, so the bits could change.
  int allReducePieces = 2;
  int64_t allReduceSplitBytes = int64_t(4) << 20;
  // A sum all-reduce of fp32 or fp64 below allReduceSplitBytes on a 2-rank group runs as one
  // exchange: each rank sends its whole tensor and adds the other's. The ring's reduce-scatter
  // and all-gather are two dependent steps of half the bytes each, so the exchange moves the
  // same bytes with one wait; a + b = b + a, so both ranks and the ring get the same bits.
  bool allReduceExchange = true;
};

// Every rank increments its own counter in the store every `interval`; when a collective
// fails, the ranks whose counters stopped are the lost ones, named with their hosts. A rank
// that cannot reach the store says so, and where the store lives.
class Liveness {
 public:
  Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Millis interval = Millis(200));
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;
  // Blocks ~4 intervals. Returns a human-readable verdict, e.g. "lost rank(s): 1 (host b)".
  // `error` is the failed operation's message: with every heartbeat alive, a connection
  // error means a peer that runs but cannot be reached, not a slow one.
  std::string diagnose(const std::string& error = {});
  // Who runs where (world rank order), and where the store is, for the verdicts.
  void setHosts(std::vector<std::string> hosts);
  void setStoreWhere(std::string where) { storeWhere_ = std::move(where); }
  void stop();

 private:
  struct Beat;
  std::string rankAt(int r) const;
  c10::intrusive_ptr<c10d::Store> store_;
  std::shared_ptr<Beat> beat_;
  int rank_, size_;
  Millis interval_;
  std::vector<std::string> hosts_;
  std::string storeWhere_ = "on rank 0";
  std::thread thread_;
};

class Comm;

class Work {
 public:
  Work() = default;  // already complete
  Work(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish, const Comm* comm, std::string what);
  // One collective issued as several c10d works (allReduce's pieces); complete when all are.
  Work(std::vector<c10::intrusive_ptr<c10d::Work>> ws, const Comm* comm, std::string what,
       std::function<void()> finish = {});
  Work(Work&&) = default;
  Work& operator=(Work&&) = default;
  // Waits for completion (then runs the local epilogue, if any). Throws lt::Error on failure.
  void wait();
  // True when wait() would not block (completed, failed, or already waited).
  bool ready() const;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> works_;  // empty: complete
  std::function<void()> finish_;
  const Comm* comm_ = nullptr;
  std::string what_;
};

enum class ReduceOp { Sum, Max, Min };

class Comm {
 public:
  // `globalRanks[i]` is the world rank of this group's rank i (for error messages).
  Comm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Options opts, std::string name,
       std::vector<int> globalRanks = {}, std::shared_ptr<Liveness> liveness = nullptr);
  ~Comm();

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const Options& options() const { return opts_; }
  int globalRank(int r) const { return globalRanks_[r]; }

  Work allReduce(at::Tensor t, ReduceOp op = ReduceOp::Sum);
  // out: [size * in.numel()] elements, rank i's `in` at offset i * in.numel(). Any shapes;
  // bf16 too (sent as bytes: Gloo has no bf16).
  Work allGather(at::Tensor out, at::Tensor in);
  // Several all-gathers as one collective (c10d's allgather_coalesced): outs[i] receives what
  // allGather(outs[i], ins[i]) would. Each pair has its own dtype (bf16 too): all travel as
  // bytes. Gloo receives into one flat buffer of its own (every out's bytes, rank-major) and
  // copies each rank's piece to its place in outs[i] when the collective completes.
  Work allGatherCoalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins);
  // in: any length N (flat); out: this rank's chunk of the sum, chunk sizes from chunkSizes(N).
  // in may be bf16 with out fp32: the bf16 values travel (as bytes) and are summed in fp32.
  Work reduceScatter(at::Tensor out, at::Tensor in);
  // in/out: dim 0 divisible by size; chunk i of `in` goes to rank i, out's chunk j came from j.
  Work allToAll(at::Tensor out, at::Tensor in);
  Work broadcast(at::Tensor t, int root);
  // One step of a ring: sends `send` to group rank `to` and receives `recv` (same size) from
  // `from`, concurrently. Every rank of the group calls it the same number of times in the same
  // order (each call's tag is the group's count of them). bf16 travels as bytes.
  Work sendRecv(at::Tensor send, int to, at::Tensor recv, int from);
  void barrier();

  // Chunk sizes of an N-element buffer split over the group: ZeRO's partition rule
  // (core/partition.h), ceil(N / size) each, the last ones shorter or empty.
  std::vector<int64_t> chunkSizes(int64_t n) const;

  // Text appended to a failed collective's error (the Liveness verdict on `error`).
  std::string diagnoseFailure(const std::string& error = {}) const;

 private:
  // The Gloo group itself: a ProcessGroup in libtorch 1.13, a Backend in 2.x, with the same
  // collectives either way.
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int rank_, size_;
  Options opts_;
  std::string name_;
  std::vector<int> globalRanks_;
  std::shared_ptr<Liveness> liveness_;
  int sendRecvCount_ = 0;  // the tag of the next send/recv pair (the same on every rank)
  // Sends `send` (contiguous, flat) to `to` and receives into `recv` from `from` under the next tag.
  std::vector<c10::intrusive_ptr<c10d::Work>> issueSendRecv(const at::Tensor& send, int to, const at::Tensor& recv,
                                                           int from);
};

// The world, sequence-parallel and data-parallel groups of one rank (SP groups
// are contiguous ranks of size sp; DP groups join ranks with the same SP rank).
// With spRingDegree R > 1 the SP group is also split (sp/layout.h) into Ulysses groups of
// U = sp / R adjacent SP ranks and ring groups of R SP ranks striding by U.
struct Groups {
  std::shared_ptr<Liveness> liveness;
  std::shared_ptr<Comm> world, sp, dp;
  std::shared_ptr<Comm> spUlysses, spRing;  // R = 1: sp and null; U = 1: null and sp
};

Groups makeGroups(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int spSize, Options opts,
                  c10::intrusive_ptr<c10d::Store> heartbeatStore = {}, int spRingDegree = 1);

// Rendezvous from a torchrun-style environment (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT). A missing RANK means a single-rank run. The
// store: LONGTRAIN_STORE_FILE's file (one node, launched by longtrain); a client of node 0's
// launcher's TCPStore under LONGTRAIN_STORE_PREFIX (several nodes); else rank 0 hosts a
// TCPStore on MASTER_PORT (torchrun's ranks).
struct EnvRendezvous {
  int rank = 0, size = 1, localRank = 0, localSize = 1;
  c10::intrusive_ptr<c10d::Store> store, heartbeatStore;  // null when size == 1
  std::string storeWhere;  // e.g. "at 10.0.0.1:29500 (node 0's launcher)", for messages
};
EnvRendezvous rendezvousFromEnv(Millis timeout);

}  // namespace lt::comm
