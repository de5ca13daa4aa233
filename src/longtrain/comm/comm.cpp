// Communicator implementation: c10d Gloo process groups, local epilogues for the
// collectives Gloo 1.13 lacks, and heartbeat-based diagnosis of lost ranks.
#include "longtrain/comm/comm.h"

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <sstream>

#include "longtrain/core/check.h"
#include "longtrain/core/partition.h"
#include "longtrain/core/trace.h"
#include "longtrain/core/strings.h"
#include "longtrain/core/torch_compat.h"

namespace lt::comm {

// ---------------------------------------------------------------------------- Liveness
static std::string hbKey(int r) { return "lt/hb/" + std::to_string(r); }

// What the heartbeat thread shares with its owner: the thread may outlive the Liveness when
// it is stuck in a store whose host is gone (TCPStore's reads have no timeout).
struct Liveness::Beat {
  c10::intrusive_ptr<c10d::Store> store;
  std::atomic<bool> stop{false}, done{false};
};

namespace {

// Every rank's heartbeat counter, read on a thread of its own; nullopt when the store does not
// answer within `limit` (the reading thread is then left behind, blocked).
std::optional<std::vector<int64_t>> readCounters(c10::intrusive_ptr<c10d::Store> store, int size, Millis limit) {
  struct Result {
    std::mutex m;
    std::condition_variable cv;
    bool ready = false;
    std::optional<std::vector<int64_t>> counters;
  };
  auto res = std::make_shared<Result>();
  std::thread([res, store, size] {
    std::optional<std::vector<int64_t>> c;
    try {
      std::vector<int64_t> v(size);
      for (int r = 0; r < size; ++r) v[r] = store->add(hbKey(r), 0);
      c = std::move(v);
    } catch (const std::exception&) {
    }
    std::lock_guard<std::mutex> g(res->m);
    res->counters = std::move(c);
    res->ready = true;
    res->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lk(res->m);
  if (!res->cv.wait_for(lk, limit, [&] { return res->ready; })) return std::nullopt;
  return res->counters;
}

}  // namespace

Liveness::Liveness(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Millis interval)
    : store_(store), beat_(std::make_shared<Beat>()), rank_(rank), size_(size), interval_(interval) {
  beat_->store = std::move(store);
  thread_ = std::thread([b = beat_, key = hbKey(rank), interval] {
    while (!b->stop.load()) {
      try {
        b->store->add(key, 1);
      } catch (...) {
        // The store is gone; diagnose() reports it. Keep the thread quiet.
      }
      for (int i = 0; i < 10 && !b->stop.load(); ++i) std::this_thread::sleep_for(interval / 10);
    }
    b->done.store(true);
  });
}

Liveness::~Liveness() { stop(); }

void Liveness::stop() {
  beat_->stop.store(true);
  if (!thread_.joinable()) return;
  for (int i = 0; i < 100 && !beat_->done.load(); ++i) std::this_thread::sleep_for(Millis(10));
  if (beat_->done.load()) thread_.join();
  else thread_.detach();  // blocked in a dead store: it owns what it uses
}

void Liveness::setHosts(std::vector<std::string> hosts) { hosts_ = std::move(hosts); }

std::string Liveness::rankAt(int r) const {
  if (r < static_cast<int>(hosts_.size()) && !hosts_[r].empty()) return std::to_string(r) + " (host " + hosts_[r] + ")";
  return std::to_string(r);
}

static bool isConnectionError(const std::string& e) {
  for (const char* s : {"onnection refused", "o route to host", "etwork is unreachable", "connect", "Connect"})
    if (e.find(s) != std::string::npos) return true;
  return false;
}

std::string Liveness::diagnose(const std::string& error) {
  const Millis limit = std::max(Millis(3000), interval_ * 4);
  const auto before = readCounters(store_, size_, limit);
  if (!before)
    return "the rendezvous store " + storeWhere_ + " does not answer rank " + rankAt(rank_) +
           ": its host is down, or the link to it";
  std::this_thread::sleep_for(interval_ * 4);
  const auto after = readCounters(store_, size_, limit);
  if (!after)
    return "the rendezvous store " + storeWhere_ + " stopped answering rank " + rankAt(rank_) +
           ": its host is down, or the link to it";
  std::vector<int> lost;
  for (int r = 0; r < size_; ++r)
    if ((*after)[r] == (*before)[r]) lost.push_back(r);
  if (lost.empty() && isConnectionError(error)) {
    std::string ranks;
    for (int r = 0; r < size_; ++r) ranks += (r ? ", " : "") + rankAt(r);
    return "every rank's heartbeat is alive, so a peer runs but cannot be reached at the address it advertised "
           "(ranks: " + ranks + "); set GLOO_SOCKET_IFNAME to the interface of the network the hosts share";
  }
  if (lost.empty()) return "every rank's heartbeat is alive (a rank slower than the timeout, or ranks in different collectives)";
  std::ostringstream os;
  os << "lost rank(s): ";
  for (size_t i = 0; i < lost.size(); ++i) os << (i ? ", " : "") << rankAt(lost[i]);
  os << " (no heartbeat for " << (interval_ * 4).count() << " ms: dead, stopped, or cut off)";
  return os.str();
}

// ---------------------------------------------------------------------------- Work
Work::Work(c10::intrusive_ptr<c10d::Work> w, std::function<void()> finish, const Comm* comm, std::string what)
    : finish_(std::move(finish)), comm_(comm), what_(std::move(what)) {
  works_.push_back(std::move(w));
}

Work::Work(std::vector<c10::intrusive_ptr<c10d::Work>> ws, const Comm* comm, std::string what,
           std::function<void()> finish)
    : works_(std::move(ws)), finish_(std::move(finish)), comm_(comm), what_(std::move(what)) {}

void Work::wait() {
  trace::Scope ts("collective", !works_.empty() && trace::enabled() ? what_ + " (" + comm_->name() + ")" : std::string());
  if (!works_.empty()) {
    auto ws = std::move(works_);
    works_.clear();
    try {
      for (auto& w : ws) w->wait();
    } catch (const std::exception& e) {
      const std::string msg = firstLine(e.what());  // c10 errors carry a backtrace
      LT_CHECK(false, what_, " on group '", comm_->name(), "' failed (timeout ",
               comm_->options().timeout.count(), " ms): ", msg, "; ", comm_->diagnoseFailure(msg));
    }
  }
  if (finish_) {
    auto f = std::move(finish_);
    f();
  }
}

bool Work::ready() const {
  for (const auto& w : works_)
    if (!w->isCompleted()) return false;
  return true;
}

// ---------------------------------------------------------------------------- Comm
// Gloo writes with writev, and a write to a socket whose peer died raises SIGPIPE, which would
// end this rank without a word. Ignored, the write fails (EPIPE) and the collective reports the
// lost rank. A handler the program installed itself is left alone.
static void ignoreBrokenPipes() {
  struct sigaction now {};
  if (::sigaction(SIGPIPE, nullptr, &now) == 0 && now.sa_handler == SIG_DFL) ::signal(SIGPIPE, SIG_IGN);
}

Comm::Comm(c10::intrusive_ptr<c10d::Store> store, int rank, int size, Options opts, std::string name,
           std::vector<int> globalRanks, std::shared_ptr<Liveness> liveness)
    : rank_(rank), size_(size), opts_(std::move(opts)), name_(std::move(name)),
      globalRanks_(std::move(globalRanks)), liveness_(std::move(liveness)) {
  LT_ASSERT(rank >= 0 && rank < size);
  if (globalRanks_.empty())
    for (int r = 0; r < size; ++r) globalRanks_.push_back(r);
  LT_ASSERT((int)globalRanks_.size() == size);
  ignoreBrokenPipes();
  auto o = c10d::ProcessGroupGloo::Options::create(opts_.timeout);
  if (opts_.interfaces.empty())
    o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(opts_.hostname));
  for (const auto& i : opts_.interfaces) o->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(i));
  o->threads = std::max(2, opts_.allReducePieces);  // the pieces of one all-reduce run at once
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>("lt/pg/" + name_, std::move(store));
  try {
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank, size, o);
  } catch (const std::exception& e) {
    const std::string msg = firstLine(e.what());
    LT_CHECK(false, "cannot connect group '", name_, "' (rank ", rank, " of ", size, ", timeout ",
             opts_.timeout.count(), " ms): ", msg, "; ", diagnoseFailure(msg.empty() ? "connect" : msg));
  }
}

Comm::~Comm() = default;

std::string Comm::diagnoseFailure(const std::string& error) const {
  if (!liveness_) return "no heartbeat to tell which rank was lost";
  return liveness_->diagnose(error);
}

static c10d::ReduceOp toC10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return c10d::ReduceOp::SUM;
    case ReduceOp::Max: return c10d::ReduceOp::MAX;
    case ReduceOp::Min: return c10d::ReduceOp::MIN;
  }
  LT_ASSERT(false);
}

Work Comm::allReduce(at::Tensor t, ReduceOp op) {
  if (size_ == 1) return {};
  LT_ASSERT(t.is_contiguous());
  c10d::AllreduceOptions o;
  o.reduceOp = toC10d(op);
  o.timeout = opts_.timeout;
  const int64_t n = t.numel(), bytes = n * static_cast<int64_t>(t.element_size());
  if (size_ == 2 && op == ReduceOp::Sum && opts_.allReduceExchange && bytes < opts_.allReduceSplitBytes &&
      (t.scalar_type() == at::kFloat || t.scalar_type() == at::kDouble)) {
    auto theirs = at::empty_like(t);
    return Work(issueSendRecv(t, 1 - rank_, theirs, 1 - rank_), this, "allReduce",
                [t, theirs]() mutable { t.add_(theirs); });
  }
  // Every rank splits alike (same size, op and options), so the pieces' tags match up.
  const bool split = size_ == 2 && op == ReduceOp::Sum && opts_.allReducePieces > 1 &&
                     bytes >= opts_.allReduceSplitBytes;
  const int64_t pieces = split ? std::min<int64_t>(opts_.allReducePieces, n) : 1;
  auto flat = t.view({-1});
  std::vector<c10::intrusive_ptr<c10d::Work>> ws;
  for (int64_t k = 0; k < pieces; ++k) {
    std::vector<at::Tensor> ts{pieces == 1 ? t : flat.narrow(0, n * k / pieces, n * (k + 1) / pieces - n * k / pieces)};
    ws.push_back(pg_->allreduce(ts, o));
  }
  return Work(std::move(ws), this, "allReduce");
}

Work Comm::allGather(at::Tensor out, at::Tensor in) {
  LT_ASSERT(out.numel() == in.numel() * size_, "allGather: out has ", out.numel(), " elements, expected ",
            in.numel() * size_);
  LT_ASSERT(out.is_contiguous() && out.scalar_type() == in.scalar_type());
  // Gloo 1.13 refuses bf16 ("Invalid scalar type"); a gather only moves bytes, so send them.
  if (in.scalar_type() == at::kBFloat16)
    return allGather(out.view(at::kByte), in.contiguous().view({-1}).view(at::kByte));
  auto flatOut = out.view({size_, in.numel()});
  if (size_ == 1) {
    flatOut[0].copy_(in.reshape({-1}));
    return {};
  }
  std::vector<std::vector<at::Tensor>> outs(1);
  for (int r = 0; r < size_; ++r) outs[0].push_back(flatOut[r]);
  std::vector<at::Tensor> ins{in.contiguous().view({-1})};
  c10d::AllgatherOptions o;
  o.timeout = opts_.timeout;
  return Work(pg_->allgather(outs, ins, o), nullptr, this, "allGather");
}

Work Comm::allGatherCoalesced(std::vector<at::Tensor> outs, std::vector<at::Tensor> ins) {
  LT_ASSERT(!ins.empty() && outs.size() == ins.size(), "allGatherCoalesced: ", outs.size(), " outs for ", ins.size(), " ins");
  std::vector<at::Tensor> inBytes;
  std::vector<std::vector<at::Tensor>> outLists(size_);  // [rank][i]: rank's piece of outs[i]
  for (size_t i = 0; i < ins.size(); ++i) {
    LT_ASSERT(outs[i].numel() == ins[i].numel() * size_, "allGatherCoalesced: out ", i, " has ", outs[i].numel(),
              " elements, expected ", ins[i].numel() * size_);
    LT_ASSERT(outs[i].is_contiguous() && outs[i].scalar_type() == ins[i].scalar_type());
    auto in = ins[i].contiguous().view({-1}).view(at::kByte);  // Gloo 1.13 has no bf16; one dtype for all
    auto out = outs[i].view({-1}).view(at::kByte);
    const int64_t n = in.numel();
    for (int r = 0; r < size_; ++r) outLists[r].push_back(out.narrow(0, r * n, n));
    inBytes.push_back(in);
  }
  if (size_ == 1) {
    for (size_t i = 0; i < ins.size(); ++i) outLists[0][i].copy_(inBytes[i]);
    return {};
  }
  c10d::AllgatherOptions o;
  o.timeout = opts_.timeout;  // 1.13's Gloo ignores it and bounds the collective by the group's timeout, the same
  return Work(pg_->allgather_coalesced(outLists, inBytes, o), nullptr, this, "allGatherCoalesced");
}

std::vector<int64_t> Comm::chunkSizes(int64_t n) const {
  std::vector<int64_t> c;
  for (int r = 0; r < size_; ++r) c.push_back(partitionRange(n, size_, r).length());
  return c;
}

Work Comm::reduceScatter(at::Tensor out, at::Tensor in) {
  auto chunks = chunkSizes(in.numel());
  int64_t mine = chunks[rank_];
  LT_ASSERT(out.numel() == mine, "reduceScatter: out has ", out.numel(), " elements, expected ", mine);
  LT_ASSERT(out.is_contiguous());
  if (size_ == 1) {
    out.view({-1}).copy_(in.reshape({-1}));
    return {};
  }
  auto flatIn = in.contiguous().view({-1});
  auto recv = at::empty({size_ * mine}, in.options());
  std::vector<int64_t> recvSplits(size_, mine);
  c10d::AllToAllOptions o;
  o.timeout = opts_.timeout;
  // bf16 travels as bytes (Gloo has no bf16): twice as many, at twice the offsets.
  const bool bytes = in.scalar_type() == at::kBFloat16;
  if (bytes)
    for (auto* v : {&recvSplits, &chunks})
      for (auto& x : *v) x *= 2;
  auto recvWire = bytes ? recv.view(at::kByte) : recv, sendWire = bytes ? flatIn.view(at::kByte) : flatIn;
  auto w = pg_->alltoall_base(recvWire, sendWire, recvSplits, chunks, o);
  // The epilogue sums the `size` received copies of this rank's chunk, in rank order and in
  // out's precision (bf16 copies widened first), so every rank's result is bitwise deterministic.
  return Work(w, [recv, out, mine, n = size_, flatIn]() mutable {
    auto o = out.view({mine});
    at::sum_out(o, recv.view({n, mine}).to(out.scalar_type()), {0});
  }, this, "reduceScatter");
}

Work Comm::allToAll(at::Tensor out, at::Tensor in) {
  LT_ASSERT(in.size(0) % size_ == 0 && out.sizes() == in.sizes());
  LT_ASSERT(in.is_contiguous() && out.is_contiguous());
  if (size_ == 1) {
    out.copy_(in);
    return {};
  }
  std::vector<int64_t> none;
  c10d::AllToAllOptions o;
  o.timeout = opts_.timeout;
  return Work(pg_->alltoall_base(out, in, none, none, o), nullptr, this, "allToAll");
}

Work Comm::broadcast(at::Tensor t, int root) {
  if (size_ == 1) return {};
  std::vector<at::Tensor> ts{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = opts_.timeout;
  return Work(pg_->broadcast(ts, o), nullptr, this, "broadcast");
}

Work Comm::sendRecv(at::Tensor send, int to, at::Tensor recv, int from) {
  LT_ASSERT(send.numel() == recv.numel() && send.scalar_type() == recv.scalar_type() && recv.is_contiguous());
  if (send.scalar_type() == at::kBFloat16)  // Gloo 1.13 has no bf16: the bytes travel
    return sendRecv(send.contiguous().view({-1}).view(at::kByte), to, recv.view({-1}).view(at::kByte), from);
  if (size_ == 1) {
    recv.copy_(send);
    return {};
  }
  return Work(issueSendRecv(send, to, recv, from), this, "sendRecv");
}

std::vector<c10::intrusive_ptr<c10d::Work>> Comm::issueSendRecv(const at::Tensor& send, int to, const at::Tensor& recv,
                                                                int from) {
  const int tag = sendRecvCount_;
  sendRecvCount_ = (sendRecvCount_ + 1) % (1 << 24);
  std::vector<at::Tensor> out{send.contiguous().view({-1})}, in{recv.view({-1})};
  return {pg_->send(out, to, tag), pg_->recv(in, from, tag)};
}

void Comm::barrier() {
  if (size_ == 1) return;
  // An allReduce of one element, not c10d's barrier: it honours our timeout the same way
  // as every other collective and reports lost ranks alike.
  auto t = at::zeros({1}, at::kFloat);
  Work w = allReduce(t);
  w.wait();
}

// ---------------------------------------------------------------------------- groups
Groups makeGroups(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int spSize, Options opts,
                  c10::intrusive_ptr<c10d::Store> heartbeatStore, int spRingDegree) {
  LT_CHECK(spSize >= 1 && size % spSize == 0, "sequence_parallel_size=", spSize,
           " must divide the world size ", size, "; choose a divisor of ", size);
  Groups g;
  if (size > 1) g.liveness = std::make_shared<Liveness>(heartbeatStore ? heartbeatStore : store, rank, size);
  g.world = std::make_shared<Comm>(store, rank, size, opts, "world", std::vector<int>{}, g.liveness);
  int spIndex = rank / spSize, spRank = rank % spSize, dpSize = size / spSize;
  std::vector<int> spRanks, dpRanks;
  for (int i = 0; i < spSize; ++i) spRanks.push_back(spIndex * spSize + i);
  for (int i = 0; i < dpSize; ++i) dpRanks.push_back(i * spSize + spRank);
  g.sp = spSize == size ? g.world
                        : std::make_shared<Comm>(store, spRank, spSize, opts, "sp" + std::to_string(spIndex),
                                                 spRanks, g.liveness);
  g.dp = dpSize == size ? g.world
                        : std::make_shared<Comm>(store, spIndex, dpSize, opts, "dp" + std::to_string(spRank),
                                                 dpRanks, g.liveness);
  LT_CHECK(spRingDegree >= 1 && spSize % spRingDegree == 0, "sequence_parallel_ring_degree=", spRingDegree,
           " must divide sequence_parallel_size=", spSize);
  const int U = spSize / spRingDegree, ringRank = spRank / U, uRank = spRank % U;
  std::vector<int> uRanks, ringRanks;
  for (int i = 0; i < U; ++i) uRanks.push_back(spIndex * spSize + ringRank * U + i);
  for (int i = 0; i < spRingDegree; ++i) ringRanks.push_back(spIndex * spSize + i * U + uRank);
  auto sub = [&](const std::string& name, int r, const std::vector<int>& members) -> std::shared_ptr<Comm> {
    if (members.size() == 1) return nullptr;
    if (static_cast<int>(members.size()) == spSize) return g.sp;
    return std::make_shared<Comm>(store, r, static_cast<int>(members.size()), opts, name, members, g.liveness);
  };
  g.spUlysses = sub("sp" + std::to_string(spIndex) + "u" + std::to_string(ringRank), uRank, uRanks);
  g.spRing = sub("sp" + std::to_string(spIndex) + "r" + std::to_string(uRank), ringRank, ringRanks);
  if (spSize == 1) g.spUlysses = g.sp;
  return g;
}

static int envInt(const char* key, int def) {
  const char* v = std::getenv(key);
  if (!v || !*v) return def;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  LT_CHECK(end && *end == 0 && x >= 0, "environment variable ", key, "='", v, "' is not a non-negative integer");
  return static_cast<int>(x);
}

namespace {

// Rank 0 hosts the store (torchrun's ranks), or every rank is a client of node 0's launcher.
void connectTcpStore(EnvRendezvous& r, const std::string& addr, int port, bool agentStore, Millis timeout) {
  auto o = compat::tcpStoreOptions<c10d::TCPStoreOptions>();
  o.port = static_cast<uint16_t>(port);
  o.isServer = !agentStore && r.rank == 0;
  o.numWorkers = agentStore ? c10::nullopt : c10::optional<std::size_t>(r.size);
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    r.store = c10::make_intrusive<c10d::TCPStore>(addr, o);
    c10d::TCPStoreOptions h = o;
    h.isServer = false;  // a second client connection for the heartbeat thread
    r.heartbeatStore = c10::make_intrusive<c10d::TCPStore>(addr, h);
  } catch (const std::exception& e) {
    const std::string msg = firstLine(e.what());
    LT_CHECK(!o.isServer, "rank 0 cannot listen on MASTER_PORT=", port, ": ", msg, " (port ", port, " is in use, by ",
             "another job's store?); choose another MASTER_PORT");
    LT_CHECK(false, "rank ", r.rank, ": cannot reach the rendezvous store ", r.storeWhere, " within ",
             timeout.count() / 1000, " s: ", msg);
  }
}

}  // namespace

EnvRendezvous rendezvousFromEnv(Millis timeout) {
  EnvRendezvous r;
  r.size = envInt("WORLD_SIZE", 1);
  r.rank = envInt("RANK", 0);
  r.localRank = envInt("LOCAL_RANK", r.rank);
  r.localSize = envInt("LOCAL_WORLD_SIZE", r.size);
  LT_CHECK(r.rank < r.size, "RANK=", r.rank, " must be below WORLD_SIZE=", r.size);
  if (r.size == 1) return r;
  if (const char* file = std::getenv("LONGTRAIN_STORE_FILE"); file && *file) {
    r.store = c10::make_intrusive<c10d::FileStore>(file, -1);  // -1: the launcher removes the file
    r.heartbeatStore = c10::make_intrusive<c10d::FileStore>(file, -1);
    r.storeWhere = std::string("in ") + file;
    return r;
  }
  const char* addr = std::getenv("MASTER_ADDR");
  LT_CHECK(addr && *addr, "WORLD_SIZE=", r.size, " but MASTER_ADDR is not set; set MASTER_ADDR and MASTER_PORT ",
           "(as torchrun does) or use --nproc N");
  int port = envInt("MASTER_PORT", -1);
  LT_CHECK(port > 0 && port < 65536, "MASTER_PORT must be set to a TCP port (1..65535)");
  const char* prefix = std::getenv("LONGTRAIN_STORE_PREFIX");
  const bool agent = prefix && *prefix;
  r.storeWhere = "at " + std::string(addr) + ":" + std::to_string(port) + (agent ? " (node 0's launcher)" : " (rank 0)");
  connectTcpStore(r, addr, port, agent, timeout);
  // The heartbeat's reads are bounded well below the collective timeout, so a diagnosis
  // never waits as long as the failure it explains.
  r.heartbeatStore->setTimeout(std::min(timeout, Millis(5000)));
  if (agent) {
    r.store = c10::make_intrusive<c10d::PrefixStore>(prefix, r.store);
    r.heartbeatStore = c10::make_intrusive<c10d::PrefixStore>(prefix, r.heartbeatStore);
  }
  return r;
}

}  // namespace lt::comm
