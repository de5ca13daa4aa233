// The sharded optimizer: partitions, IPG buckets, SuperOffload worker and validation. Threads: the trainer
// thread runs everything but the worker's Adam steps; the two meet only through the task
// and result channels, and a sub-group's buffers are touched by one side at a time (the
// trainer hands a sub-group over after its gradient is final, and takes it back in step()).
// Non-obvious: a stage 3 gather of a group is one allgather_coalesced whose outputs are the
// parameters' places in one parameter-major buffer, and the parameters become views of it. The
// partition stays per parameter (rank r holds chunk r of each), so on the wire the group is
// rank-major; Gloo (1.13 and 2.x) receives any all-gather into a flat buffer of its own and
// copies out of it, and that copy de-interleaves for free. A group-major partition would save no
// copy under Gloo and would move every rank's shard: checkpoint pieces, the norm's sum order.
#include "longtrain/zero/sharded_optimizer.h"

#include <ATen/ATen.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "longtrain/core/check.h"
#include "longtrain/core/partition.h"
#include "longtrain/core/trace.h"
#include "longtrain/kernels/fused_ops.h"
#include "longtrain/offload/grad_verdict.h"

namespace lt::zero {

void widenBf16InPlace(const at::Tensor& buf, int64_t n) {
  const auto half = buf.view(at::kBFloat16);
  int64_t hi = n;
  for (; hi > 4096; hi = (hi + 1) / 2) {
    const int64_t lo = (hi + 1) / 2;
    buf.narrow(0, lo, hi - lo).copy_(half.narrow(0, lo, hi - lo));  // disjoint bytes: [4 lo, 4 hi), [2 lo, 2 hi)
  }
  float* f = buf.data_ptr<float>();
  const auto* b = reinterpret_cast<const unsigned char*>(f);
  for (int64_t i = hi - 1; i >= 0; --i) {
    uint16_t half16;
    std::memcpy(&half16, b + 2 * i, sizeof half16);
    const uint32_t bits = static_cast<uint32_t>(half16) << 16;
    std::memcpy(f + i, &bits, sizeof bits);
  }
}

namespace {

kernels::AdamParams adamParams(const config::OptimizerConfig& o) {
  kernels::AdamParams ap;
  ap.lr = o.lr;
  ap.beta1 = o.beta1;
  ap.beta2 = o.beta2;
  ap.eps = o.eps;
  ap.weightDecay = o.weightDecay;
  ap.adamw = o.decoupledDecay();
  return ap;
}

double decayOf(model::ParamRole role, const ShardedOptimizerOptions& o) {
  switch (role) {
    case model::ParamRole::Matrix: return o.adam.weightDecay;
    case model::ParamRole::Embedding: return o.decayEmbeddings ? o.adam.weightDecay : 0.0;
    case model::ParamRole::Vector: return 0.0;
  }
  return 0.0;
}

}  // namespace

ShardedOptimizerOptions ShardedOptimizerOptions::from(const config::Config& cfg, bool bf16Gemms, int threads, const std::vector<int>& rankCpus) {
  ShardedOptimizerOptions zo;
  zo.stage = cfg.zero.stage;
  zo.subGroupSize = cfg.zero.subGroupSize;
  zo.reduceBucketSize = cfg.zero.reduceBucketSize;
  zo.allgatherBucketSize = cfg.zero.allgatherBucketSize;
  zo.overlapComm = cfg.zero.overlapComm;
  zo.reduceBf16 = cfg.precision.communication == config::CommDtype::Bf16;
  zo.gradientClipping = cfg.gradientClipping;
  zo.adam = adamParams(cfg.optimizer);
  zo.decayEmbeddings = cfg.optimizer.decayEmbeddings;
  zo.bf16Gathers = bf16Gemms && cfg.precision.gathers && zo.stage > 0;  // stage 0 moves no parameter
  const auto& off = cfg.zero.offloadOptimizer;
  zo.superOffload = off.superOffload;
  zo.ratio = off.ratio;
  zo.workerTimeout = std::chrono::milliseconds(cfg.train.commTimeoutMs());
  zo.workerCores = std::max(1, static_cast<int>(std::lround(off.cpuadamCoresPerc * threads)));
  if (zo.stage == 0 && !zo.superOffload) zo.workerCores = threads;  // Adam runs on the trainer's threads, between steps
  if (!zo.superOffload) return zo;
  zo.workerCores = std::min(zo.workerCores, std::max(1, threads - 1));
  const int owned = static_cast<int>(rankCpus.size());
  for (int c = std::max(0, owned - zo.workerCores); c < owned; ++c) zo.workerCpus.push_back(rankCpus[c]);
  return zo;
}

// The same steps in the same order at every stage (as torchtitan applies FSDP); each does what
// the stage asks of it, so no caller branches on the stage.
ShardedOptimizer::ShardedOptimizer(const model::Model& m, std::shared_ptr<comm::Comm> world, int dpSize, ShardedOptimizerOptions o)
    : world_(std::move(world)), dpSize_(dpSize), o_(std::move(o)) {
  LT_ASSERT(o_.stage >= 0 && o_.stage <= 3, "ZeRO stage ", o_.stage);
  LT_ASSERT(o_.stage > 0 || (!o_.bf16Gathers && !o_.reduceBf16), "stage 0 moves no parameter and all-reduces in fp32");
  applyPartitioning(m);
  applyOptimizerState();
  applyOwnership();
  applyGradientBuckets();
  applyOffloadWorker();
}

// Parameters in model order, cut into sub-groups of at most sub_group_size elements; each
// parameter's chunk is ceil(numel / partitions) (the whole parameter at stage 0).
void ShardedOptimizer::applyPartitioning(const model::Model& m) {
  const int W = partitions();
  groupParams_.resize(m.numGroups());
  int64_t sgNumel = 0;
  for (int g : m.groupOrder())  // Hugging Face order: the LM head's sub-group completes first
    for (const auto& np : m.group(g)) {
      ParamInfo pi;
      pi.group = g;
      pi.tensor = np.tensor;
      pi.shape = np.tensor.sizes().vec();
      pi.numel = np.tensor.numel();
      pi.chunk = partitionChunk(pi.numel, W);
      pi.bf16 = o_.bf16Gathers && np.role == model::ParamRole::Matrix;
      pi.weightDecay = decayOf(np.role, o_);
      if (subGroups_.empty() || (sgNumel + pi.numel > o_.subGroupSize && sgNumel > 0)) {
        subGroups_.emplace_back();
        sgNumel = 0;
      }
      sgNumel += pi.numel;
      auto& sg = subGroups_.back();
      pi.subGroup = static_cast<int>(subGroups_.size()) - 1;
      pi.offset = sg.partNumel;
      sg.partNumel += pi.chunk;
      sg.params.push_back(static_cast<int>(params_.size()));
      groupParams_[g].push_back(static_cast<int>(params_.size()));
      params_.push_back(pi);
      ledger_.unpartitionedBytes += pi.numel * 16;
      if (o_.stage == 1 || o_.stage == 2) ledger_.replicaBytes += pi.numel * 4;
    }
}

// Each sub-group's fp32 master and gradient, its Adam state (each parameter's chunk with its own
// weight decay), its bf16 copy where a parameter travels as bf16, and whether SuperOffload's
// worker steps it: the last ratio x n, which backward completes first, so they overlap the most.
void ShardedOptimizer::applyOptimizerState() {
  adam_ = std::make_unique<kernels::CpuAdam>(o_.adam, std::max(1, o_.workerCores));
  const int n = numSubGroups();
  const int offloaded = o_.superOffload ? static_cast<int>(std::lround(o_.ratio * n)) : 0;
  for (int s = 0; s < n; ++s) {
    auto& sg = subGroups_[s];
    sg.master = at::zeros({sg.partNumel}, at::kFloat);
    sg.grad = at::zeros({sg.partNumel}, at::kFloat);
    std::vector<kernels::DecaySpan> decay;
    for (int i : sg.params) decay.push_back({params_[i].offset, params_[i].chunk, params_[i].weightDecay});
    sg.adamGroup = adam_->addGroup(sg.partNumel, decay);
    sg.offloaded = s >= n - offloaded;
    ledger_.paramBytes += sg.partNumel * 4;
    ledger_.gradBytes += sg.partNumel * 4;
    ledger_.optimBytes += sg.partNumel * 8;
    if (sg.offloaded) ledger_.rollbackBytes += sg.partNumel * 12;
    if (std::any_of(sg.params.begin(), sg.params.end(), [&](int i) { return params_[i].bf16; })) {
      sg.masterBf16 = at::empty({sg.partNumel}, at::kBFloat16);
      ledger_.paramBytes += sg.partNumel * 2;
    }
  }
}

// This rank's chunk of every (identically initialized) parameter into the masters; stage 3
// frees the rest, stage 0's parameters and gradients become views of the masters and gradients.
void ShardedOptimizer::applyOwnership() {
  const int W = partitions(), r = partitionRank();
  for (auto& pi : params_) {
    auto flat = pi.tensor.detach().reshape({-1});
    const PartitionRange mine = partitionRange(pi.numel, W, r);
    if (mine.length() > 0)
      subGroups_[pi.subGroup].master.narrow(0, pi.offset, mine.length()).copy_(flat.slice(0, mine.begin, mine.end));
    if (o_.stage == 3) pi.tensor.set_data(at::empty({0}, pi.tensor.options()));
  }
  if (o_.stage == 0) aliasReplicas();
  refreshBf16Copies();
}

// Gradients travel in buckets of whole parameters, one sub-group at a time: reduce-scattered
// into partitions (stages 1-3) or all-reduced in place (stage 0).
void ShardedOptimizer::applyGradientBuckets() {
  pendingGathers_.resize(groupParams_.size());
  gatheredGroupBytes_.assign(groupParams_.size(), 0);
  std::vector<int> counts;
  for (const auto& sg : subGroups_) counts.push_back(static_cast<int>(sg.params.size()));
  buckets_ = std::make_unique<IpgBuckets>(counts, [this](int sg, std::vector<GradItem>& items) { onBucket(sg, items); });
}

void ShardedOptimizer::applyOffloadWorker() {
  if (std::any_of(subGroups_.begin(), subGroups_.end(), [](const SubGroup& sg) { return sg.offloaded; }))
    worker_ = std::thread([this] { workerLoop(); });
}

ShardedOptimizer::~ShardedOptimizer() {
  tasks_.close();
  if (worker_.joinable()) worker_.join();
}

void ShardedOptimizer::setLr(double lr) { adam_->setLr(lr); }

// ---------------------------------------------------------------------------- gather/release
// One collective for whatever of the group is neither gathered nor in flight: this rank's
// chunks (bf16 copies for bf16 parameters) all-gathered as bytes into one buffer, each
// parameter's W chunks contiguous at its own place (Gloo's copy-out puts them there).
void ShardedOptimizer::prefetch(int group) {
  if (o_.stage < 3) return;  // parameters are whole
  const int W = world_->size();
  auto& pend = pendingGathers_[group];
  std::vector<int> todo;
  int64_t total = 0;
  for (int i : groupParams_[group]) {
    const auto& pi = params_[i];
    if (pi.tensor.numel() == pi.numel) continue;  // already gathered
    bool inFlight = false;
    for (const auto& pg : pend) inFlight |= std::find(pg.params.begin(), pg.params.end(), i) != pg.params.end();
    if (inFlight) continue;
    LT_ASSERT(!pi.bf16 || !bf16Stale_, "bf16 gather after resetState() without syncParameters()");
    todo.push_back(i);
    total += W * pi.chunk;
  }
  if (todo.empty()) return;
  auto buffer = at::empty({total}, at::kFloat);
  std::vector<at::Tensor> outs, ins;
  int64_t pos = 0;
  for (int i : todo) {
    const auto& pi = params_[i];
    const auto& sg = subGroups_[pi.subGroup];
    auto place = buffer.narrow(0, pos, W * pi.chunk);  // a bf16 gather fills its first half
    outs.push_back(pi.bf16 ? place.view(at::kBFloat16).narrow(0, 0, W * pi.chunk) : place);
    ins.push_back((pi.bf16 ? sg.masterBf16 : sg.master).narrow(0, pi.offset, pi.chunk));
    pos += W * pi.chunk;
  }
  pend.push_back({std::move(todo), buffer, world_->allGatherCoalesced(std::move(outs), std::move(ins))});
  ledger_.gatheredBytes += total * 4;  // the buffer is live from now on
  ledger_.gatheredPeakBytes = std::max(ledger_.gatheredPeakBytes, ledger_.gatheredBytes);
}

void ShardedOptimizer::gather(int group) {
  if (o_.stage < 3) return;
  prefetch(group);  // starts whatever is not gathered or in flight
  const int W = world_->size();
  for (auto& pg : pendingGathers_[group]) {
    pg.work.wait();
    int64_t pos = 0;
    for (int i : pg.params) {
      auto& pi = params_[i];
      auto place = pg.buffer.narrow(0, pos, W * pi.chunk);
      if (pi.bf16) widenBf16InPlace(place, pi.numel);
      pi.tensor.set_data(place.narrow(0, 0, pi.numel).view(pi.shape));
      pos += W * pi.chunk;
    }
    gatheredGroupBytes_[group] += pos * 4;
  }
  pendingGathers_[group].clear();
}

void ShardedOptimizer::releaseAll() {
  for (size_t g = 0; g < groupParams_.size(); ++g) {
    for (auto& pg : pendingGathers_[g]) pg.work.wait();  // never drop an in-flight collective
    if (!pendingGathers_[g].empty()) gather(static_cast<int>(g));
    release(static_cast<int>(g));
  }
}

// The group's buffers go when the last view of them does (the parameters' here).
void ShardedOptimizer::release(int group) {
  if (o_.stage < 3) return;
  for (int i : groupParams_[group]) {
    auto& pi = params_[i];
    if (pi.tensor.numel() == pi.numel) pi.tensor.set_data(at::empty({0}, pi.tensor.options()));
  }
  ledger_.gatheredBytes -= gatheredGroupBytes_[group];
  gatheredGroupBytes_[group] = 0;
}

std::vector<at::Tensor> ShardedOptimizer::fullParameters() {
  const int W = partitions();
  std::vector<at::Tensor> out;
  for (auto& pi : params_) {
    auto full = at::empty({W * pi.chunk}, at::kFloat);
    const auto mine = subGroups_[pi.subGroup].master.narrow(0, pi.offset, pi.chunk);
    if (W == 1) full.copy_(mine);
    else world_->allGather(full, mine).wait();
    out.push_back(full.narrow(0, 0, pi.numel).view(pi.shape).clone());
  }
  return out;
}

// ---------------------------------------------------------------------------- checkpoint state
std::vector<StateShard> ShardedOptimizer::stateShards() {
  std::vector<StateShard> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& pi = params_[i];
    const PartitionRange mine = partitionRange(pi.numel, partitions(), partitionRank());
    if (mine.length() <= 0) continue;
    auto& sg = subGroups_[pi.subGroup];
    out.push_back({static_cast<int>(i), mine.begin, mine.length(), sg.master.data_ptr<float>() + pi.offset,
                   adam_->expAvg(sg.adamGroup) + pi.offset, adam_->expAvgSq(sg.adamGroup) + pi.offset});
  }
  return out;
}

int64_t ShardedOptimizer::adamStepCount() const {
  int64_t step = subGroups_.empty() ? 0 : adam_->stepCount(subGroups_[0].adamGroup);
  for (const auto& sg : subGroups_)
    LT_ASSERT(adam_->stepCount(sg.adamGroup) == step, "sub-groups disagree on the Adam step count");
  return step;
}

void ShardedOptimizer::resetState(int64_t adamStep, int64_t skippedSteps) {
  releaseAll();
  for (auto& sg : subGroups_) {
    sg.master.zero_();
    sg.grad.zero_();
    std::fill_n(adam_->expAvg(sg.adamGroup), sg.partNumel, 0.0f);
    std::fill_n(adam_->expAvgSq(sg.adamGroup), sg.partNumel, 0.0f);
    adam_->setStepCount(sg.adamGroup, adamStep);
    sg.speculated = false;
  }
  skipped_ = skippedSteps;
  replicasStale_ = o_.stage == 1 || o_.stage == 2;  // stage 0's parameters are the masters  // the caller fills the masters; syncParameters() copies them out
  bf16Stale_ = true;
}

void ShardedOptimizer::refreshBf16Copies() {
  for (auto& sg : subGroups_)
    if (sg.masterBf16.defined()) sg.masterBf16.copy_(sg.master);  // to nearest even, as Adam rounds
  bf16Stale_ = false;
}

void ShardedOptimizer::syncParameters() {
  if (bf16Stale_) refreshBf16Copies();
  if (!replicasStale_) return;
  gatherReplicas();
  replicasStale_ = false;
}

// Runs of whole parameters whose W gathered chunks hold at most maxElements (at least one
// parameter each: a bigger one travels alone).
std::vector<ShardedOptimizer::Run> ShardedOptimizer::runs(const SubGroup& sg, int64_t maxElements, bool byDtype) const {
  const int64_t W = partitions();
  std::vector<Run> out;
  for (int k = 0; k < static_cast<int>(sg.params.size()); ++k) {
    const auto& pi = params_[sg.params[k]];
    const bool sameDtype = !byDtype || (k > 0 && params_[sg.params[k - 1]].bf16 == pi.bf16);
    if (!out.empty() && sameDtype && (out.back().length + pi.chunk) * W <= maxElements) {
      out.back().last = k + 1;
      out.back().length += pi.chunk;
    } else {
      out.push_back({k, k + 1, pi.offset, pi.chunk});
    }
  }
  return out;
}

comm::Work ShardedOptimizer::issue(comm::Work w) {
  if (!o_.overlapComm) w.wait();
  return w;
}

// Stages 1 and 2: every rank's updated master chunks (bf16 copies for bf16 parameters),
// all-gathered run by run (one in flight while the previous one is copied out) into the full
// parameters. Its bytes: zero::masterGatherFootprint.
void ShardedOptimizer::gatherReplicas() {
  const int W = world_->size();
  struct InFlight {
    const SubGroup* sg;
    Run run;
    at::Tensor out;  // [W, run.length]
    comm::Work work;
  };
  auto unpack = [&](InFlight& f) {
    f.work.wait();
    for (int k = f.run.first; k < f.run.last; ++k) {
      auto& pi = params_[f.sg->params[k]];
      auto padded = f.out.narrow(1, pi.offset - f.run.offset, pi.chunk).reshape({-1});  // [W * chunk]
      pi.tensor.detach().view({-1}).copy_(padded.narrow(0, 0, pi.numel));  // widens bf16 exactly
    }
  };
  std::optional<InFlight> prev;
  for (const auto& sg : subGroups_)
    for (const Run& run : runs(sg, o_.allgatherBucketSize, /*byDtype=*/true)) {
      const bool bf16 = params_[sg.params[run.first]].bf16;
      LT_ASSERT(!bf16 || !bf16Stale_, "bf16 replica refresh after resetState() without syncParameters()");
      auto out = at::empty({W, run.length}, bf16 ? at::kBFloat16 : at::kFloat);
      auto mine = (bf16 ? sg.masterBf16 : sg.master).narrow(0, run.offset, run.length);
      InFlight f{&sg, run, out, issue(world_->allGather(out.view({-1}), mine))};
      if (prev) unpack(*prev);
      prev = std::move(f);
    }
  if (prev) unpack(*prev);
}

// ---------------------------------------------------------------------------- gradients
void ShardedOptimizer::reduceGrads(int group, bool boundary) {
  if (!handsOver(boundary)) return;
  boundary_ = boundary;
  for (int i : groupParams_[group]) {
    auto& pi = params_[i];
    at::Tensor g = pi.tensor.grad();
    if (!g.defined()) continue;  // no gradient this micro-step: counts as zero in finish()
    if (o_.stage > 0) pi.tensor.mutable_grad() = at::Tensor();  // the full gradient lives only in its bucket now
    buckets_->add({i, pi.subGroup, g});  // stage 0: a view of the sub-group's gradient, reduced in place
  }
  pollReduces(false);
}

bool ShardedOptimizer::handsOver(bool boundary) const {
  if (o_.stage == 0 && world_->size() == 1) return false;  // nothing to reduce: the gradients are final
  return boundary || o_.stage >= 2;  // stages 0 and 1 accumulate whole until the boundary
}

// Before the next micro-batch (stages 2 and 3 under accumulation) the reduce-scatters finish, as
// DeepSpeed's epilogue waits for its reduction stream: left pending, their send and receive
// buffers (the whole model's gradients with the default sub_group_size) stayed through the next
// forward, 13% over the peak the plan predicts for a micro-step. At the boundary the optimizer
// step waits for them, and SuperOffload overlaps them with its Adam.
void ShardedOptimizer::finishBackward(bool boundary) {
  if (!handsOver(boundary)) return;
  buckets_->finish();
  buckets_->resetStep();
  pollReduces(/*block=*/!boundary);
}

// Its bytes: zero::bucketReduceFootprint.
void ShardedOptimizer::onBucket(int sgId, std::vector<GradItem>& items) {
  if (o_.stage == 0) return allReduceInPlace(sgId);
  const int W = world_->size();
  auto& sg = subGroups_[sgId];
  std::vector<at::Tensor> grads(sg.params.size());  // by position in the sub-group; missing: zero
  for (auto& it : items) grads[it.param - sg.params.front()] = std::move(it.grad);
  const std::vector<Run> pieces = runs(sg, o_.reduceBucketSize, /*byDtype=*/false);
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Run& run = pieces[p];
    // send row j = chunk j of every parameter of the run, so one reduce-scatter hands rank j
    // exactly its part of the partition.
    auto send = at::zeros({W, run.length}, at::kFloat);
    for (int k = run.first; k < run.last; ++k) {
      if (!grads[k].defined()) continue;
      auto& pi = params_[sg.params[k]];
      auto padded = at::zeros({W * pi.chunk}, at::kFloat);
      padded.narrow(0, 0, pi.numel).copy_(grads[k].reshape({-1}));
      send.narrow(1, pi.offset - run.offset, pi.chunk).copy_(padded.view({W, pi.chunk}));
      grads[k] = at::Tensor();
    }
    auto recv = at::empty({run.length}, at::kFloat);
    const auto flat = send.view({-1});
    comm::Work w = issue(world_->reduceScatter(recv, o_.reduceBf16 ? flat.to(at::kBFloat16) : flat));
    pending_.push({sgId, boundary_, p + 1 == pieces.size(), run.offset, recv, std::move(w)});
  }
}

// Stage 0: the sub-group's gradient (the parameters' .grad are views of it) summed over the world
// in place, in runs of at most reduce_bucket_size elements; finishReduce divides by the DP size.
void ShardedOptimizer::allReduceInPlace(int sgId) {
  auto& sg = subGroups_[sgId];
  const std::vector<Run> pieces = runs(sg, o_.reduceBucketSize, /*byDtype=*/false);
  for (size_t p = 0; p < pieces.size(); ++p) {
    auto part = sg.grad.narrow(0, pieces[p].offset, pieces[p].length);
    pending_.push({sgId, boundary_, p + 1 == pieces.size(), pieces[p].offset, part, issue(world_->allReduce(part))});
  }
}

void ShardedOptimizer::pollReduces(bool block) {
  while (!pending_.empty() && (block || pending_.front().work.ready())) {
    PendingReduce r = pending_.pop();
    finishReduce(r);
  }
}

void ShardedOptimizer::finishReduce(PendingReduce& r) {
  r.work.wait();
  if (o_.stage == 0) r.recv.mul_(1.0 / dpSize_);  // reduced in place
  else subGroups_[r.subGroup].grad.narrow(0, r.offset, r.recv.numel()).add_(r.recv, 1.0 / dpSize_);
  if (r.boundary && r.last) gradFinal(r.subGroup);  // pieces finish in order
}

void ShardedOptimizer::gradFinal(int sgId) {
  auto& sg = subGroups_[sgId];
  if (inject_ && inject_->first == sgId) {
    sg.grad[0] = inject_->second;
    inject_.reset();
  }
  if (!sg.offloaded) return;  // stepped in step(), after validation
  sg.speculated = true;
  ++dispatched_;
  LT_ASSERT(tasks_.push({sgId}), "the SuperOffload worker is closed");
}

// ---------------------------------------------------------------------------- Adam
void ShardedOptimizer::stepSubGroup(int sgId) {
  auto& sg = subGroups_[sgId];
  float *master = sg.master.data_ptr<float>(), *grad = sg.grad.data_ptr<float>();
  if (!sg.masterBf16.defined()) return adam_->step(sg.adamGroup, master, grad);
  adam_->stepBf16(sg.adamGroup, reinterpret_cast<uint16_t*>(sg.masterBf16.data_ptr<at::BFloat16>()), master, grad);
}

void ShardedOptimizer::stepSpeculative(int sgId) {
  auto& sg = subGroups_[sgId];
  if (!sg.shadowMaster.defined()) sg.shadowMaster = at::empty({sg.partNumel}, at::kFloat);
  adam_->stepSpeculative(sg.adamGroup, sg.master.data_ptr<float>(), sg.grad.data_ptr<float>(),
                         sg.shadowMaster.data_ptr<float>());
}

void ShardedOptimizer::workerLoop() {
  if (!o_.workerCpus.empty()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : o_.workerCpus) CPU_SET(c, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);  // the kernel's threads inherit it
  }
  trace::nameThread("SuperOffload Adam worker");
  while (auto t = tasks_.pop()) {
    trace::Scope ts("adam", trace::enabled() ? "speculative Adam, sub-group " + std::to_string(t->subGroup) : "");
    try {
      using Clock = std::chrono::steady_clock;
      auto t0 = Clock::now();
      stepSpeculative(t->subGroup);
      workerAdamNs_ += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
      results_.push(int(t->subGroup));
    } catch (...) {
      results_.push(-1 - t->subGroup);
    }
  }
}

void ShardedOptimizer::drainResults(int expected) {
  for (int k = 0; k < expected; ++k) {
    auto res = results_.popFor(o_.workerTimeout);
    if (!res) {
      std::string missing;
      for (int s = 0; s < numSubGroups(); ++s)
        if (subGroups_[s].speculated) missing += (missing.empty() ? "" : ", ") + std::to_string(s);
      LT_CHECK(false, "SuperOffload: CPU Adam results missing after ", o_.workerTimeout.count(),
               " ms; outstanding sub-group(s) among: ", missing);
    }
    LT_CHECK(*res >= 0, "SuperOffload: the CPU Adam step of sub-group ", -1 - *res, " failed");
  }
}

// The squared global norm, in float64 so it does not depend on the order of small sums, and
// without a float64 copy of any gradient (16 bytes an element at the step's end). Stage 0
// sums each parameter's gradient (every rank holds them all, reduced); stages 1-3 sum every
// rank's partitions (disjoint) and add them over the world.
double ShardedOptimizer::squaredGradNorm() {
  double sq = 0;
  if (o_.stage == 0) {
    for (auto& pi : params_) sq += kernels::sumOfSquares(pi.tensor.grad());
    return sq;
  }
  for (auto& sg : subGroups_) sq += kernels::sumOfSquares(sg.grad);
  auto stats = at::tensor({sq}, at::kDouble);
  world_->allReduce(stats).wait();
  return stats.item<double>();
}

// Stage 0: the model's parameters and their gradients become views of the sub-groups' masters
// and gradients, so Adam updates the model in place and the gradients are reduced in place.
void ShardedOptimizer::aliasReplicas() {
  for (auto& pi : params_) {
    auto& sg = subGroups_[pi.subGroup];
    pi.tensor.set_data(sg.master.narrow(0, pi.offset, pi.numel).view(pi.shape));
    pi.tensor.mutable_grad() = sg.grad.narrow(0, pi.offset, pi.numel).view(pi.shape);
  }
}

ZeroStepResult ShardedOptimizer::step() {
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  pollReduces(/*block=*/true);
  drainResults(dispatched_);
  ZeroStepResult res;
  res.waitSeconds = std::chrono::duration<double>(Clock::now() - t0).count();
  res.workerAdamSeconds = workerAdamNs_.exchange(0) * 1e-9;
  res.speculated = dispatched_;
  dispatched_ = 0;

  const offload::GradVerdict v = offload::judgeGradients(squaredGradNorm(), o_.gradientClipping);
  res.gradNorm = v.norm;
  for (int s = 0; s < numSubGroups(); ++s) {
    auto& sg = subGroups_[s];
    if (!sg.speculated) continue;
    if (v.skip || v.clip) {
      ++res.rolledBack;  // drop the shadows: state and step count never changed
    } else {
      std::swap(sg.master, sg.shadowMaster);
      adam_->commitSpeculative(sg.adamGroup);
      if (sg.masterBf16.defined()) sg.masterBf16.copy_(sg.master);  // the worker wrote fp32 only
    }
  }
  if (o_.stage == 0 && res.speculated > res.rolledBack) aliasReplicas();  // the parameters view the new masters
  if (v.skip || v.clip)
    for (auto& sg : subGroups_) sg.speculated = false;
  if (v.skip) {
    res.skipped = true;
    ++skipped_;
  } else {
    if (v.clip)
      for (auto& sg : subGroups_) sg.grad.mul_(v.clipCoef);
    auto t1 = Clock::now();
    for (int s = 0; s < numSubGroups(); ++s)
      if (!subGroups_[s].speculated) stepSubGroup(s);
    res.adamSeconds = std::chrono::duration<double>(Clock::now() - t1).count();
    if (o_.stage == 1 || o_.stage == 2) gatherReplicas();  // a skipped step leaves masters and replicas as they were
  }
  for (auto& sg : subGroups_) {
    sg.grad.zero_();
    sg.speculated = false;
  }
  releaseAll();  // parameters kept gathered (selective_gather) are re-gathered fresh next step
  return res;
}

}  // namespace lt::zero
