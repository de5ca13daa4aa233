// Engine: the loop body of training. Everything distributed goes through comm::Comm; the
// step itself is the compile::Program run by compile::Executor.
#include "longtrain/train/engine.h"

#include <ATen/ATen.h>

#include <ATen/Parallel.h>
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/config/validate.h"
#include "longtrain/core/check.h"
#include "longtrain/core/memory.h"
#include "longtrain/data/tokenizer.h"
#include "longtrain/kernels/fused_attention.h"
#include "longtrain/model/attention.h"
#include "longtrain/offload/grad_verdict.h"
#include "longtrain/plan/fit.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/sp/ring_attention.h"
#include "longtrain/train/lr_schedule.h"
#include "longtrain/train/machine.h"

namespace lt::train {

// The document separator of data.packing "documents": data.eos_id, else the tokenizer's EOS.
int64_t packingEos(const Config& cfg, const data::Tokenizer* tok) {
  if (cfg.data.eosId >= 0) return cfg.data.eosId;
  LT_ASSERT(tok, "validate() requires data.eos_id or data.tokenizer with packing");
  LT_CHECK(tok->eosId() >= 0, "data.tokenizer '", cfg.data.tokenizer, "' has no EOS token; set data.eos_id");
  return tok->eosId();
}

void checkTokenizerFits(const Config& cfg, const data::Tokenizer& tok) {
  const int64_t v = tok.vocabSize();
  LT_CHECK(v <= cfg.model.vocabSize, "data.tokenizer '", cfg.data.tokenizer, "' has ", v,
           " tokens, more than model.vocab_size=", cfg.model.vocabSize, "; raise model.vocab_size to at least ", v,
           " or use the tokenizer the model was trained with");
}

std::shared_ptr<const data::Dataset> makeDataset(const Config& cfg, bool eval) {
  // Loaded once per dataset; the vocabulary is checked with the training split.
  std::unique_ptr<data::Tokenizer> tok;
  if (!cfg.data.tokenizer.empty()) tok = std::make_unique<data::Tokenizer>(cfg.data.tokenizer);
  if (tok && !eval) checkTokenizerFits(cfg, *tok);
  const auto& d = cfg.data;
  if (d.type == config::DataType::KvRecall) {
    data::KvRecallOptions o;
    o.seqLen = d.seqLen;
    o.numSamples = eval ? std::max<int64_t>(1, d.evalSamples) : d.numSamples;
    o.numPairs = d.kvPairs;
    o.numQueries = d.kvQueries;
    o.numKeys = d.kvKeys;
    o.numValues = d.kvValues;
    o.numNoise = d.kvNoise;
    o.fused = d.kvFused;
    o.seed = eval ? cfg.seed ^ 0x5EEDE7A1ull : cfg.seed;
    return std::make_shared<data::KvRecallDataset>(o);  // validate() checked the vocabulary
  }
  const int width = d.type == config::DataType::Bytes ? 1 : d.type == config::DataType::Uint16 ? 2 : 4;
  data::TokenWindows w;
  w.packEos = d.packing == config::Packing::Documents ? packingEos(cfg, tok.get()) : -1;
  // The file's windows are counted once, where the held-out split or the eval cap needs them.
  // eval_fraction holds the last windows out; evaluation covers at most data.eval_samples of
  // them, or without eval_fraction of the file's first (which training reads too; the banner
  // says so).
  if (d.evalFraction > 0 || eval) {
    const int64_t all = data::TokenFileDataset(d.path, width, d.seqLen, cfg.model.vocabSize).fileWindows();
    int64_t first = 0, count = all;
    if (d.evalFraction > 0) {
      const int64_t held = std::max<int64_t>(1, std::llround(d.evalFraction * static_cast<double>(all)));
      LT_CHECK(held < all, "data.eval_fraction=", d.evalFraction, " leaves no training window of the ", all,
               " in data.path='", d.path, "'");
      first = eval ? all - held : 0;
      count = eval ? held : all - held;
    }
    w.firstWindow = first;
    w.numWindows = eval ? std::min(count, d.evalSamples) : count;
  }
  return std::make_shared<data::TokenFileDataset>(d.path, width, d.seqLen, cfg.model.vocabSize, w);
}

void agreeOnPlan(const config::RunPlan& plan, comm::Comm& world) {
  const auto fields = plan.agreedFields();
  const int64_t n = static_cast<int64_t>(fields.size());
  auto t = at::empty({2 * n}, at::kDouble);  // [values, -values]: one Max gives the max and the min
  double* d = t.data_ptr<double>();
  for (int64_t i = 0; i < n; ++i) d[i] = fields[i].second, d[n + i] = -fields[i].second;
  world.allReduce(t, comm::ReduceOp::Max).wait();
  for (int64_t i = 0; i < n; ++i)
    LT_CHECK(-d[n + i] == d[i], "the ranks resolved the run plan differently: ",
             fields[i].first, " is ", -d[n + i], " on some ranks and ", d[i],
             " on others (this rank: ", fields[i].second, "); the ranks' machines differ. Set the option ",
             "explicitly in the config so that every rank takes the same");
}

Engine::Engine(const Config& cfg, comm::Groups groups, EngineOptions opts) : cfg_(cfg), groups_(std::move(groups)) {
  const config::ParallelLayout& lay = cfg_.layout;
  LT_ASSERT(groups_.sp->size() == lay.P && groups_.world->size() == lay.world, "the groups and the config's layout ",
            "disagree: config validated for another world size");
  LT_ASSERT(lay.R == 1 || (groups_.spRing && groups_.spRing->size() == lay.R), "the config resolves SP to ",
            lay.describe(), " but comm::makeGroups was given no ring degree ", lay.R);
  config::KernelChoices& k = plan_.kernels;
  k.oneDnnGemm = model::oneDnnRunsFp32Gemms(cfg_.model.gemm);  // a rule: no collective
  k.bf16Gemms = cfg_.precision.bf16 && chooseBf16();  // against the fp32 route just chosen
  // bf16.attention asked for, where the model's rule allows it (bf16 GEMMs, the fused kernel, a
  // CPU with AVX512_BF16) and it is faster: a CPU capability, so agreeOnPlan() refuses a world
  // whose CPUs differ. The conditions before the measurement are the config's, the same on every
  // rank, so every rank joins its collective.
  k.bf16Attention = bf16AttentionAskedFor(cfg_, k.bf16Gemms) && chooseBf16Attention();
  LT_ASSERT(k.bf16Attention == model::attentionInBf16(plan_.model(cfg_.model)),
            "bf16.attention's choice and the model's rule (model::attentionInBf16) disagree");
  k.packedDocuments = cfg_.data.packing == config::Packing::Documents;
  plan_.memoryBudget = plan::memoryBudgetFor(cfg_, opts.localRanks > 0 ? opts.localRanks : groups_.world->size());
  chooseTiling();  // before the model: it is built with the tiling
  // With init_from the weights come from its safetensors (loadInitialWeights, below).
  model_ = std::make_unique<model::Model>(plan_.model(cfg_.model), cfg_.seed, /*initialize=*/cfg_.model.initFrom.empty());
  std::vector<int64_t> groupBytes;  // before ZeRO-3 frees the full tensors
  for (int g = 0; g < model_->numGroups(); ++g) {
    int64_t b = 0;
    for (const auto& p : model_->group(g)) b += p.tensor.nbytes();
    groupBytes.push_back(b);
  }
  passCtx_ = compile::PassContext::from(cfg_, model_->numBlocks(), std::move(groupBytes));
  train_ = makeDataset(cfg_, false);
  eval_ = cfg_.data.evalSamples > 0 ? makeDataset(cfg_, true) : nullptr;
  buildLoader();
  buildOptimizer(opts);
  if (!cfg_.model.initFrom.empty()) loadInitialWeights();
  plan_.graphBlocks = chooseGraphBlocks();
  agreeOnPlan(plan_, *groups_.world);
  // A budget the user set binds the resident set: without decommit, spans a step frees and
  // later requests split stay resident and pile up over steps (bench/max_seq_peer.json at 16,870
  // tokens, 768 MiB: 773.8 then 822.3 MiB, tcmalloc's free bytes 237 then 286 MiB; with it
  // 769.4, 769.7, 769.7 and 0 free). Unless the budget is generous (plan::decommitsFreedMemory;
  // then keepWithinBudget watches). Process-wide: ranks that are threads share it.
  if (plan::decommitsFreedMemory(plan_.applied(cfg_), groups_.world->size(), plan_.graphBlocks))
    decommitFreedMemory();
  else
    watchResident_ = cfg_.train.memoryBudget > 0 && allocatorName() == "tcmalloc";
  buildProgram();
  buildExecutor();
}

void Engine::buildLoader() {
  data::LoaderOptions lo;
  lo.microBatch = cfg_.microBatch;
  lo.gradAccum = cfg_.gradAccum;
  lo.dpRank = groups_.dp->rank();
  lo.dpSize = groups_.dp->size();
  lo.spRank = groups_.sp->rank();
  lo.spSize = groups_.sp->size();
  lo.seed = cfg_.seed;
  if (groups_.sp->size() == 1) {
    loader_ = std::make_unique<data::Loader>(train_, lo);
    return;
  }
  auto src = std::make_unique<sp::LoaderSource>(std::make_unique<data::Loader>(train_, lo));
  spLoader_ = &src->loader();
  ulysses_ = std::make_unique<sp::UlyssesLoader>(std::move(src), groups_.sp, cfg_.layout);
}

void Engine::buildOptimizer(const EngineOptions& opts) {
  const int threads = at::get_num_threads();
  zero::ShardedOptimizerOptions zo = zero::ShardedOptimizerOptions::from(cfg_, plan_.kernels.bf16Gemms, threads, opts.rankCpus);
  if (zo.superOffload && threads > 1) at::set_num_threads(threads - zo.workerCores);  // the trainer keeps the rest
  zero_ = std::make_unique<zero::ShardedOptimizer>(*model_, groups_.world, groups_.dp->size(), std::move(zo));
}

// The step program: the base, rewritten by passes; a schedule swaps the pass list.
void Engine::buildProgram() {
  base_ = compile::baseProgram(model_->numBlocks(), plan_.graphBlocks);
  if (cfg_.compile.deepcompile) schedule_ = compile::Schedule(compile::scheduleOf(cfg_));
  activePasses_ = compile::fixedPasses(cfg_);
  program_ = compile::applyPasses(base_, activePasses_, passCtx_);
  if (!cfg_.train.offloadDir.empty()) makeActivationOffload();
}

// The executor with the hooks that connect the program's collectives to ZeRO or DP, and the
// attention core (through the SP all-to-alls and ring when P > 1).
void Engine::buildExecutor() {
  compile::Hooks hooks;  // the optimizer answers each for its stage (gathers are no-ops below 3)
  hooks.gather = [this](int g) { zero_->gather(g); };
  hooks.prefetch = [this](int g) { zero_->prefetch(g); };
  hooks.gatheredBytes = [this] { return zero_->ledger().gatheredBytes; };
  hooks.release = [this](int g) { zero_->release(g); };
  hooks.reduceGrads = [this](int g, bool boundary) { zero_->reduceGrads(g, boundary); };
  model::AttentionFn core = model::attentionCore(model_->config());
  model::AttentionFn attn = groups_.sp->size() > 1
                                ? sp::sequenceParallelAttention(groups_.spUlysses, groups_.spRing, cfg_.layout,
                                                                groups_.sp->rank(), core, cfg_.model.attentionChunk,
                                                                nullptr, cfg_.model.slidingWindow,
                                                                sp::ulyssesPipeline(model_->config(),
                                                                                    config::ulyssesHeadGroups(cfg_, cfg_.layout)),
                                                                model::attentionInBf16(model_->config()))
                                : core;
  exec_ = std::make_unique<compile::Executor>(*model_, attn, std::move(hooks), offload_.get());
}

// One file per rank, its slots reserved now for the blocks the program offloads (a full disk
// or an unwritable directory is found here, before any step).
void Engine::makeActivationOffload() {
  const auto& c = program_.code;
  const int blocks = static_cast<int>(std::count_if(c.begin(), c.end(), [](const compile::Instr& i) {
    return i.op == compile::OpCode::OffloadActivation;
  }));
  const int64_t local = cfg_.layout.paddedLength(cfg_.data.seqLen) / cfg_.layout.P;
  const int64_t slot = cfg_.microBatch * local * cfg_.model.hidden * 4;  // [B, S/P, D] fp32
  const std::string warning = offload::checkOffloadDir(cfg_.train.offloadDir);
  if (blocks > 0)
    offload_ = std::make_unique<compile::ActivationOffload>(
        cfg_.train.offloadDir, groups_.world->rank(), slot, blocks,
        fmt::format("{} block inputs of [{}, {}, {}] fp32", blocks, cfg_.microBatch, local, cfg_.model.hidden));
  if (groups_.world->rank() != 0) return;
  if (!warning.empty()) std::printf("longtrain: warning: %s\n", warning.c_str());
  if (blocks > 0)
    std::printf("longtrain: activation offload: %d of %lld block inputs to a file in %s (unlinked at once: it "
                "goes with the process), %.2f MiB reserved per rank\n",
                blocks, (long long)cfg_.model.layers, cfg_.train.offloadDir.c_str(),
                offload_->file().reservedBytes() / 1048576.0);
  else
    std::printf("longtrain: activation offload: no block input to offload (%d of %lld blocks keep their graph; the "
                "last recomputed block's input stays in memory)\n",
                plan_.graphBlocks, (long long)cfg_.model.layers);
}

Engine::~Engine() = default;

bool Engine::chooseBf16() {
  const double fp32 = measureGemmPeakFlops(plan_.kernels.oneDnnGemm ? kernels::GemmRoute::OneDnn : kernels::GemmRoute::Blas);
  const double bf16 = measureGemmPeakFlops(kernels::GemmRoute::Bf16);
  // Every rank must build the same model: bf16 only if it is faster on every rank, by 10%: on a
  // CPU without AVX512_BF16 oneDNN widens bf16 to fp32 and the two tie at 1024^3 (AMD EPYC Zen 2
  // under load: 29.8/44.8, 38.4/36.0, 90.2/87.1 GFLOP/s), while the small shapes' bf16 GEMMs,
  // with their conversions, ran the quick start at 13.5k tokens/s against 43.4k in fp32.
  auto t = at::tensor({bf16 > kBf16FasterBy * fp32 || !cfg_.precision.onlyIfFaster ? 1.0 : 0.0}, at::kDouble);
  groups_.world->allReduce(t, comm::ReduceOp::Min).wait();
  const bool use = t.item<double>() > 0;
  gemmPeakFlops_ = use ? bf16 : fp32;
  if (groups_.world->rank() == 0)
    std::printf("longtrain: bf16.enabled: bf16 GEMM %.1f GFLOP/s against fp32 (%s) %.1f on this CPU (1024^3, %d threads): %s\n",
                bf16 / 1e9, plan_.kernels.oneDnnGemm ? "oneDNN" : "BLAS", fp32 / 1e9, at::get_num_threads(),
                use ? "GEMMs run in bf16, weights and optimizer in fp32"
                    : "bf16 is not 10% faster here, training runs in fp32 (bf16.only_if_faster=false forces bf16)");
  return use;
}

// bf16AttentionWinsHere on every rank, then the world's agreement.
bool Engine::chooseBf16Attention() {
  Bf16AttentionChoice c;
  bool use = bf16AttentionWinsHere(cfg_, &c);
  auto t = at::tensor({use ? 1.0 : 0.0}, at::kDouble);
  groups_.world->allReduce(t, comm::ReduceOp::Min).wait();
  use = t.item<double>() > 0;
  if (groups_.world->rank() == 0 && c.bf16Seconds > 0)
    std::printf("longtrain: bf16.attention: bf16 tile products (%s) %.1f ms against fp32 %.1f (forward + backward, "
                "%lld tokens): %s\n",
                kernels::fusedAttentionBf16Engine(), 1e3 * c.bf16Seconds, 1e3 * c.fp32Seconds, (long long)c.tokens,
                use ? "attention runs its products in bf16" : "not 10% faster here, attention stays fp32");
  return use;
}

// model.loss_chunk / tiled_mlp "auto": each rank chooses against its own budget, and the world
// takes the most tiling any rank needs (the tiling changes no collective, but every rank must
// build the same program).
void Engine::chooseTiling() {
  if (!cfg_.model.lossChunkAuto && !cfg_.model.tiledMlpAuto) return;
  const plan::Tiling t = plan::chooseTiling(plan_.applied(cfg_), groups_.world->size(), plan_.memoryBudget);
  // The choice's place in plan::kLossChunkChoices (least tiling first): the largest wins.
  const auto& chunks = plan::kLossChunkChoices;
  const auto pos = std::find(std::begin(chunks), std::end(chunks), t.lossChunk);
  const double level = cfg_.model.lossChunkAuto ? static_cast<double>(pos - std::begin(chunks)) : 0;
  auto v = at::tensor({level, t.tiledMlp ? 1.0 : 0.0}, at::kDouble);
  groups_.world->allReduce(v, comm::ReduceOp::Max).wait();
  plan_.lossChunk = chunks[static_cast<int>(v[0].item<double>())];
  plan_.tiledMlp = v[1].item<double>() > 0;
  const config::ModelConfig m = plan_.model(cfg_.model);
  if (groups_.world->rank() == 0)
    std::printf("longtrain: \"auto\" tiling against %.0f MiB a rank: model.loss_chunk %lld, model.tiled_mlp %s\n",
                static_cast<double>(plan_.memoryBudget) / 1048576.0, (long long)m.lossChunk, m.tiledMlp ? "true" : "false");
}

int Engine::chooseGraphBlocks() {
  const int k = plan::graphBlocksFor(plan_.applied(cfg_), groups_.world->size(), plan_.memoryBudget);
  // Every rank must run the same program (its collectives pair up): the smallest choice wins.
  auto t = at::tensor({static_cast<double>(k)}, at::kDouble);
  groups_.world->allReduce(t, comm::ReduceOp::Min).wait();
  return static_cast<int>(t.item<double>());
}

data::Batch Engine::nextMicroBatch() {
  if (ulysses_) return ulysses_->next();
  data::Batch b = loader_->next();
  b.shift_labels = data::shiftLabels(b.labels);
  return b;
}

void Engine::recompile(const std::vector<std::string>& passes, int64_t step) {
  // Every rank must take the same decisions: the profile is the max over ranks.
  if (lastProfile_.valid() && groups_.world->size() > 1) {
    const int64_t n = static_cast<int64_t>(lastProfile_.instrs.size());
    auto t = at::empty({3 * n + 1}, at::kDouble);
    auto* d = t.data_ptr<double>();
    for (int64_t i = 0; i < n; ++i) {
      d[i] = lastProfile_.instrs[i].seconds;
      d[n + i] = static_cast<double>(lastProfile_.instrs[i].liveBefore);
      d[2 * n + i] = static_cast<double>(lastProfile_.instrs[i].liveAfter);
    }
    d[3 * n] = static_cast<double>(lastProfile_.peakLive);
    groups_.world->allReduce(t, comm::ReduceOp::Max).wait();
    for (int64_t i = 0; i < n; ++i) {
      lastProfile_.instrs[i].seconds = d[i];
      lastProfile_.instrs[i].liveBefore = static_cast<int64_t>(d[n + i]);
      lastProfile_.instrs[i].liveAfter = static_cast<int64_t>(d[2 * n + i]);
    }
    lastProfile_.peakLive = static_cast<int64_t>(d[3 * n]);
  }
  passCtx_.profile = &lastProfile_;
  program_ = compile::applyPasses(base_, passes, passCtx_);
  passCtx_.profile = nullptr;
  activePasses_ = passes;
  if (onRecompile) onRecompile(step, passes, program_);
}

std::vector<at::Tensor> Engine::fullParameters() {
  return zero_->fullParameters();
}

// Each rank copies its own state shards (all of every tensor without ZeRO-3, its slices with
// it) from the mapped files: the rest of the model is never read into this rank's memory.
void Engine::loadInitialWeights() {
  ckpt::HfWeights w(cfg_.model.initFrom, "model.init_from");
  zero_->resetState(0, 0);  // masters are filled below; stages 1 and 2 refresh replicas after
  std::vector<ckpt::ExpectedTensor> expected;
  for (const auto& m : parameterMeta()) expected.push_back({m.name, m.shape});
  w.check(expected, cfg_.model.tieEmbeddings);
  for (const auto& s : stateShards())
    w.read(expected[s.param].name, s.offset, at::from_blob(s.master, {s.length}, at::kFloat));
}

// ---------------------------------------------------------------------------- checkpoint state
std::vector<ckpt::ParamMeta> Engine::parameterMeta() const {
  std::vector<ckpt::ParamMeta> out;
  for (int g : model_->groupOrder())
    for (const auto& np : model_->group(g)) {
      // Under ZeRO-3 the model's tensors are empty between gathers; the sharded optimizer keeps the shapes.
      const int i = static_cast<int>(out.size());
      out.push_back({np.name, zero_->paramShape(i)});
    }
  return out;
}

std::vector<StateShard> Engine::stateShards() { return zero_->stateShards(); }

int64_t Engine::adamStepCount() const { return zero_->adamStepCount(); }

int64_t Engine::loaderCursor() const { return spLoader_ ? spLoader_->cursor() : loader_->cursor(); }

void Engine::resetToStep(int64_t step, int64_t adamStep, int64_t skippedSteps) {
  LT_ASSERT(step_ == 0 && (!ulysses_ || ulysses_->queued() == 0), "restore into a fresh engine only");
  step_ = step;
  // The DP group's stream has served step x accumulation micro-batches. Under SP each
  // Ulysses gather takes one from each SP rank's loader and serves P shards: seek past the
  // whole gathers, then replay the partial one (collective, like training).
  const int64_t served = step * cfg_.gradAccum;
  if (ulysses_) {
    const int64_t P = groups_.sp->size();
    spLoader_->seek(served / P);
    for (int64_t i = 0; i < served % P; ++i) (void)ulysses_->next();
  } else {
    loader_->seek(served);
  }
  zero_->resetState(adamStep, skippedSteps);
}

void Engine::optimizerStep() {
  lastZero_ = zero_->step();
  lastGradNorm_ = lastZero_.gradNorm;
}

StepMetrics Engine::step() {
  auto t0 = std::chrono::steady_clock::now();
  zero_->syncParameters();  // after a restore at stages 1 and 2
  if (auto e = schedule_.take(step_)) recompile(e->passes, step_);
  ++step_;
  lastLr_ = lrAt(cfg_.scheduler, cfg_.optimizer.lr, step_ - 1);
  zero_->setLr(lastLr_);  // before backward: SuperOffload steps during it
  double lossSum = 0;  // sum over micro-batches of (local loss sum / SP-group denominator)
  double exposedGather = 0;
  int64_t activationPeak = 0;
  int64_t tokens = 0, correct = 0;
  const double waited = offload_ ? offload_->waitSeconds() : 0, io = offload_ ? offload_->file().ioSeconds() : 0;
  for (int64_t j = 0; j < cfg_.gradAccum; ++j) {
    data::Batch b = nextMicroBatch();
    auto cnt = at::tensor({b.shift_labels.ne(data::kIgnoreIndex).sum().item<double>()}, at::kDouble);
    groups_.sp->allReduce(cnt).wait();
    double denom = std::max(1.0, cnt.item<double>());
    compile::RunOptions ro;
    ro.lossDenominator = denom;
    ro.gradScale = 1.0 / static_cast<double>(cfg_.gradAccum);
    ro.boundary = j + 1 == cfg_.gradAccum;
    compile::Profile prof;
    if (j == 0) ro.profile = &prof;
    auto st = exec_->run(program_, b, ro);
    zero_->finishBackward(ro.boundary);
    if (j == 0) {
      lastProfile_ = std::move(prof);
      for (size_t i = 0; i < program_.code.size(); ++i)
        if (program_.code[i].op == compile::OpCode::Gather) exposedGather += lastProfile_.instrs[i].seconds;
      activationPeak = st.peakActivationBytes;
    }
    lossSum += st.lossSum / denom;
    tokens += st.tokens;
    correct += st.correct;
  }
  optimizerStep();  // where the program's OptimizerStep says: after the boundary's backward
  // Reported figures: mean over micro-batches and DP ranks; peak memory: max over ranks.
  auto sums = at::tensor({lossSum, static_cast<double>(tokens), static_cast<double>(correct)}, at::kDouble);
  groups_.world->allReduce(sums).wait();
  auto peak = at::tensor({static_cast<double>(peakRssBytes())}, at::kDouble);
  groups_.world->allReduce(peak, comm::ReduceOp::Max).wait();

  StepMetrics m;
  m.step = step_;
  m.loss = sums[0].item<double>() / (cfg_.gradAccum * groups_.dp->size());
  m.accuracy = sums[1].item<double>() > 0 ? sums[2].item<double>() / sums[1].item<double>() : 0;
  m.lr = lastLr_;
  m.gradNorm = lastGradNorm_;
  m.tokens = cfg_.trainBatchSize * train_->seqLen();
  m.peakRssBytes = static_cast<int64_t>(peak.item<double>());
  m.exposedGatherS = exposedGather;
  m.activationPeakBytes = activationPeak;
  if (offload_) {
    m.offloadWaitS = offload_->waitSeconds() - waited;
    m.offloadIoS = offload_->file().ioSeconds() - io;
  }
  m.zero = lastZero_;
  m.stepTimeS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  keepWithinBudget();
  return m;
}

// A run that keeps freed spans (a generous budget) starts decommitting once its resident set
// passes kDecommitAtShare of the budget's fit: spans piling up over steps stop there.
void Engine::keepWithinBudget() {
  if (!watchResident_) return;
  const double rss = static_cast<double>(currentRssBytes()), fit = static_cast<double>(plan::fitBytes(cfg_.train.memoryBudget));
  if (rss <= plan::kDecommitAtShare * fit) return;
  watchResident_ = false;
  if (decommitFreedMemory())
    std::printf("longtrain: rank %d: resident %.0f MiB after step %lld passed %.0f%% of train.memory_budget's %.0f MiB "
                "fit: freed memory goes back to the system from now on\n",
                groups_.world->rank(), rss / 1048576.0, static_cast<long long>(step_), plan::kDecommitAtShare * 100,
                fit / 1048576.0);
}

EvalMetrics Engine::evaluate() {
  EvalMetrics e;
  if (!eval_) return e;
  zero_->syncParameters();
  // Each DP group takes every dp-th eval sample; the SP ranks of a group take their shards.
  const int dpRank = groups_.dp->rank(), dpSize = groups_.dp->size();
  double lossSum = 0, tokens = 0, correct = 0;
  std::vector<data::Sample> chunk;
  auto flush = [&] {
    if (chunk.empty()) return;
    data::Batch b = data::collate(chunk);
    b.shift_labels = data::shiftLabels(b.labels);
    if (groups_.sp->size() > 1) b = sp::shardBatch(b, groups_.sp->rank(), cfg_.layout);
    auto st = exec_->evaluate(program_, b);
    lossSum += st.lossSum;
    tokens += static_cast<double>(st.tokens);
    correct += static_cast<double>(st.correct);
    chunk.clear();
  };
  for (int64_t i = dpRank; i < eval_->size(); i += dpSize) {
    chunk.push_back(eval_->get(i));
    if (static_cast<int64_t>(chunk.size()) == cfg_.microBatch) flush();
  }
  flush();
  auto sums = at::tensor({lossSum, tokens, correct}, at::kDouble);
  groups_.world->allReduce(sums).wait();
  e.tokens = static_cast<int64_t>(sums[1].item<double>());
  e.loss = e.tokens ? sums[0].item<double>() / sums[1].item<double>() : 0;
  e.accuracy = e.tokens ? sums[2].item<double>() / sums[1].item<double>() : 0;
  return e;
}

}  // namespace lt::train
