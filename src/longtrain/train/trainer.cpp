// Training loop: one Engine::step per optimizer step; rank 0 reports.
#include "longtrain/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/core/check.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/memory.h"
#include "longtrain/core/phase.h"
#include "longtrain/core/stop.h"
#include "longtrain/core/strings.h"
#include "longtrain/core/trace.h"
#include "longtrain/data/tokenizer.h"
#include "longtrain/model/generate.h"
#include "longtrain/model/model.h"
#include "longtrain/plan/memory_model.h"
#include "longtrain/train/engine.h"
#include "longtrain/train/long_eval.h"
#include "longtrain/train/machine.h"
#include "longtrain/train/peak_record.h"

namespace lt::train {

namespace {
std::string humanTime(double s) {
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{:.0f}m{:02.0f}s", std::floor(s / 60), std::fmod(s, 60));
  return fmt::format("{:.0f}h{:02.0f}m", std::floor(s / 3600), std::fmod(s / 60, 60));
}
// Rank 0's own copy of the current weights, for work beside the step program (samples,
// train.eval). Gathered under ZeRO-3, so every rank calls current(); gathered once per step
// however many users ask (the step is the same on every rank, so all skip together).
class WeightCopy {
 public:
  // The model holding the weights after the engine's last step; null on ranks other than 0.
  model::Model* current(Engine& engine, bool lead) {
    if (step_ != engine.globalStep()) {
      step_ = engine.globalStep();
      auto params = engine.fullParameters();  // collective under ZeRO-3
      if (lead) {
        if (!model_) model_ = std::make_unique<model::Model>(engine.model().config(), 0, /*initialize=*/false);
        auto mine = model_->parameters();
        at::NoGradGuard ng;
        for (size_t i = 0; i < mine.size(); ++i) mine[i].detach().copy_(params[i]);
      }
    }
    return lead ? model_.get() : nullptr;
  }

 private:
  int64_t step_ = -1;
  std::unique_ptr<model::Model> model_;
};

// train.sample_every: a short generation from the current weights (rank 0 decodes on its copy).
class Sampler {
 public:
  explicit Sampler(const Config& cfg) : cfg_(cfg) {
    if (cfg.train.sampleEvery <= 0) return;  // nothing to load for a run that never samples
    if (!cfg.data.tokenizer.empty()) tok_ = std::make_unique<data::Tokenizer>(cfg.data.tokenizer);
    LT_CHECK(cfg.train.samplePrompt.empty() || tok_, "train.sample_prompt needs data.tokenizer to encode it");
    if (tok_) prompt_ = tok_->encode(cfg.train.samplePrompt);
    // Packed documents each follow an EOS (training never sees BOS there).
    const bool afterEos = cfg.data.packing == config::Packing::Documents || tok_ == nullptr || tok_->bosId() < 0;
    const int64_t start = !tok_ ? -1 : afterEos ? tok_->eosId() : tok_->bosId();
    if (start >= 0) prompt_.insert(prompt_.begin(), start);
    if (prompt_.empty()) prompt_.push_back(0);
  }
  void maybeSample(Engine& engine, WeightCopy& weights, int64_t step, bool lead) {
    if (cfg_.train.sampleEvery <= 0 || step % cfg_.train.sampleEvery != 0) return;
    model::Model* model = weights.current(engine, lead);
    if (!model) return;
    at::NoGradGuard ng;
    model::SamplingOptions o;
    o.temperature = 0.8;
    o.topK = 40;
    o.maxNewTokens = cfg_.train.sampleTokens;
    o.stopToken = tok_ ? tok_->eosId() : -1;
    const auto ids = model::generate(*model, prompt_, o);
    std::string text;
    if (tok_) {  // decoded with the prompt: SentencePiece drops a leading space
      std::vector<int64_t> all = prompt_;
      all.insert(all.end(), ids.begin(), ids.end());
      text = tok_->decode(all);
    } else {
      for (int64_t id : ids) text += std::to_string(id) + " ";
    }
    std::printf("sample @ step %lld: %s\n", (long long)step, text.c_str());
  }

 private:
  const Config& cfg_;
  std::unique_ptr<data::Tokenizer> tok_;
  std::vector<int64_t> prompt_;
};

// train.eval: the loss by position over a token file at each evaluation, as `longtrain eval`
// measures it, on rank 0's copy of the weights.
class LongEvaluator {
 public:
  explicit LongEvaluator(const Config& cfg) {
    const auto& e = cfg.train.longEval;
    if (e.data.empty()) return;
    opts_ = positionLossOptions(e.data, e.seqLen, e.windows, e.dtype, e.packing == config::Packing::Documents, -1, cfg.data.eosId,
                                "train.eval.data");
  }
  std::optional<PositionLoss> maybeEvaluate(Engine& engine, WeightCopy& weights, bool evalNow, bool lead) {
    if (opts_.path.empty() || !evalNow) return std::nullopt;
    model::Model* model = weights.current(engine, lead);
    if (!model) return std::nullopt;
    return evaluatePositions(*model, opts_);
  }

 private:
  PositionLossOptions opts_;
};

// SIGTERM/SIGINT on any rank stops every rank after the same step: the ranks agree each step.
int agreedStopSignal(comm::Comm& world) {
  if (world.size() == 1) return stopSignal();
  auto t = at::tensor({static_cast<int64_t>(stopSignal())}, at::kLong);
  world.allReduce(t, comm::ReduceOp::Max).wait();
  return static_cast<int>(t.item<int64_t>());
}

// An async save's outcome, agreed by every rank ("" when every rank's write succeeded).
std::string agreedAsyncOutcome(ckpt::AsyncSaver& saver, comm::Comm& world) {
  std::string error;
  try {
    saver.wait();
  } catch (const lt::Error& e) {
    error = firstLine(e.what());
  }
  auto failed = at::tensor({static_cast<int64_t>(!error.empty())}, at::kLong);
  world.allReduce(failed, comm::ReduceOp::Max).wait();
  if (failed.item<int64_t>() && error.empty()) error = "the previous checkpoint failed on another rank";
  return error;
}

// One save at the end of step `step`. Returns "" or, under on_error "warn", what failed;
// under "stop" a failure throws on every rank.
std::string saveCheckpoint(Engine& engine, ckpt::AsyncSaver& saver, const TrainOptions& opts, std::string& dir) {
  const auto& ck = engine.config().train.checkpoint;
  std::string error;
  try {
    if (ck.async) {
      error = agreedAsyncOutcome(saver, *engine.groups().world);
      LT_CHECK(error.empty() || ck.onError == config::OnSaveError::Warn, error);
      dir = saver.save(engine, ck.dir, ck.keepLast, opts.checkpointHook, opts.runId);
    } else {
      dir = ckpt::save(engine, ck.dir, ck.keepLast, opts.checkpointHook, opts.runId);
    }
  } catch (const lt::Error& e) {
    if (ck.onError != config::OnSaveError::Warn) throw;
    error = firstLine(e.what());
  }
  return error;
}

void printRecompile(int64_t step, const std::vector<std::string>& passes, const compile::Program& p, bool listing) {
  std::string list;
  for (const auto& n : passes) list += (list.empty() ? "" : ", ") + n;
  std::printf("compile: step %lld: passes [%s] -> %zu instructions\n", (long long)step, list.c_str(), p.code.size());
  if (listing) std::printf("%s", p.listing().c_str());
  std::fflush(stdout);
}

}  // namespace

// Every rank's trace events to rank 0, which writes one file (a Perfetto process per rank).
void writeTrace(const comm::Groups& groups, const std::string& path) {
  const std::string mine = trace::eventsJson();
  const int W = groups.world->size();
  auto len = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong), lens = at::empty({W}, at::kLong);
  groups.world->allGather(lens, len).wait();
  const int64_t most = std::max<int64_t>(1, lens.max().item<int64_t>());
  auto buf = at::zeros({most}, at::kByte), all = at::empty({W * most}, at::kByte);
  std::memcpy(buf.data_ptr<uint8_t>(), mine.data(), mine.size());
  groups.world->allGather(all, buf).wait();
  if (groups.world->rank() != 0) return;
  std::ofstream f(path, std::ios::trunc);
  LT_CHECK(f.good(), "--trace: cannot open '", path, "' for writing");
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  for (int r = 0; r < W; ++r) {
    const int64_t n = lens[r].item<int64_t>();
    if (n == 0) continue;
    f << (first ? "" : ",\n");
    f.write(reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * most, n);
    first = false;
  }
  f << "\n]}\n";
  LT_CHECK(f.good(), "--trace: writing '", path, "' failed");
}

namespace {

// The checkpoint to resume from: --resume, or after a restart the newest of this launch. A
// fresh run refuses a directory holding another run's checkpoints (pruning and restarts go by
// step number, so runs must not mix).
std::string resumeSource(const config::CheckpointConfig& ck, const TrainOptions& opts) {
  std::string from = opts.resume;
  if (opts.restarted && !ck.dir.empty())
    if (std::string latest = ckpt::findLatest(ck.dir, opts.runId); !latest.empty()) from = latest;
  if (from.empty() && !opts.restarted && ck.everySteps > 0) {
    const std::string old = ckpt::findLatest(ck.dir);
    LT_CHECK(old.empty(), "train.checkpoint.dir='", ck.dir, "' already holds checkpoints (newest: ", old,
             "); continue that run with --resume, or set another train.checkpoint.dir");
  }
  return from;
}

void resume(Engine& engine, const std::string& from, bool lead) {
  auto t0 = std::chrono::steady_clock::now();
  ckpt::Checkpoint c(ckpt::resolve(from, "--resume"));
  setPhase("loading the checkpoint %s", c.dir().c_str());
  ckpt::load(engine, c);
  const double loadS = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto& m = c.manifest();
  if (!lead) return;
  int64_t bytes = 0;
  for (const auto& f : m.files) bytes += f.bytes;
  std::printf("resume: from %s at step %lld (saved at world %d, sp %d, zero stage %d; %.1f MiB verified and "
              "loaded in %.3f s)\n",
              c.dir().c_str(), (long long)m.step, m.worldSize, m.spSize, m.zeroStage, bytes / 1048576.0, loadS);
  const std::string& source = engine.config().source;
  if (m.configHash == ckpt::configHash(source)) return;
  std::string keys;
  for (const auto& op : nlohmann::json::diff(m.config, nlohmann::json::parse(source)))
    keys += fmt::format(" {}", op["path"].get<std::string>());
  std::printf("resume: the config differs from the checkpoint's at:%s\n", keys.c_str());
}

// MFU's denominator: every rank's GEMM peak at the threads it trains with, summed; each the
// best recorded for its machine, or train.peak_flops (peak_record.h). (bf16 GEMMs: against
// the bf16 peak, which the engine measured when it chose bf16.) `source` is rank 0's.
double jobGemmPeak(Engine& engine, std::string* source) {
  const kernels::GemmRoute route = model::gemmRoute(engine.model().config());
  const double measured = engine.measuredGemmPeakFlops() > 0 ? engine.measuredGemmPeakFlops() : measureGemmPeakFlops(route);
  const GemmPeak mine = robustGemmPeak(route, measured, engine.config().train.peakFlops);
  *source = mine.source;
  auto t = at::tensor({mine.flops}, at::kDouble);
  engine.groups().world->allReduce(t).wait();
  return t.item<double>();
}

// One line with the run's shape: layout, ZeRO, optimizer, schedule, where the weights start; and
// a warning when the run goes past the end of a schedule that decays.
void printRunLine(const Engine& engine) {
  const Config& cfg = engine.config();
  const auto& off = cfg.zero.offloadOptimizer;
  const auto& sch = cfg.scheduler;
  const std::string zero = fmt::format("ZeRO stage {}{}", cfg.zero.stage,
                                       off.superOffload ? fmt::format(" + SuperOffload (ratio {:g})", off.ratio)
                                       : off.device == config::OffloadDevice::Cpu ? " + CPU optimizer" : "");
  const std::string optimizer = fmt::format("{}{} (lr {:g}, weight decay {:g})", config::optionName(cfg.optimizer.type),
                                            cfg.optimizer.type == config::OptimizerType::Adam
                                                ? (cfg.optimizer.decoupledDecay() ? ", decoupled decay" : ", L2 decay")
                                                : "",
                                            cfg.optimizer.lr, cfg.optimizer.weightDecay);
  const std::string schedule = sch.type == config::SchedulerType::Constant ? "constant lr"
                               : sch.type == config::SchedulerType::WarmupLR
                                   ? fmt::format("WarmupLR over {} steps", sch.warmupNumSteps)
                                   : fmt::format("{} over {} warmup steps, ending at step {}", config::optionName(sch.type),
                                                 sch.warmupNumSteps, sch.totalNumSteps);
  const std::string init = cfg.model.initFrom.empty() ? fmt::format("random init (seed {})", cfg.seed)
                                                      : "weights from " + cfg.model.initFrom;
  std::printf("longtrain: run: %s, %s, %s, %s, %s%s\n", cfg.layout.describe().c_str(), zero.c_str(),
              optimizer.c_str(), schedule.c_str(), init.c_str(),
              engine.globalStep() > 0 ? fmt::format(", resumed at step {}", engine.globalStep()).c_str() : "");
  if (sch.type != config::SchedulerType::Constant && sch.type != config::SchedulerType::WarmupLR &&
      cfg.train.steps > sch.totalNumSteps)
    std::printf("longtrain: warning: train.steps=%lld goes past scheduler.params.total_num_steps=%lld: the last "
                "%lld steps run at the schedule's final lr; raise total_num_steps to stretch the schedule\n",
                (long long)cfg.train.steps, (long long)sch.totalNumSteps,
                (long long)(cfg.train.steps - sch.totalNumSteps));
  if (sch.type != config::SchedulerType::Constant && sch.warmupNumSteps >= cfg.train.steps)
    std::printf("longtrain: warning: scheduler.params.warmup_num_steps=%lld is not shorter than the run "
                "(train.steps=%lld): the lr never reaches its peak\n",
                (long long)sch.warmupNumSteps, (long long)cfg.train.steps);
}

void printBanner(const Engine& engine, double gemmPeak, const std::string& peakSource, double flopsPerToken,
                 bool printProgram) {
  printRunLine(engine);
  const Config& cfg = engine.config();
  const comm::Groups& g = engine.groups();
  const BlasKernelReport blas = blasKernelReport();
  const model::ModelConfig& m = engine.model().config();  // with the run plan's choices
  const char* route = !m.resolved.bf16Gemms        ? (m.resolved.oneDnnGemm ? "fp32 (oneDNN)" : "fp32")
                      : model::attentionInBf16(m) ? "bf16 (attention's products too)"
                                                  : "bf16 (attention in fp32)";
  std::printf("longtrain: blas core=%s (%s%s), %d threads/rank, %s GEMM peak %.1f GFLOP/s over all ranks "
              "(rank 0's: %s), allocator %s, %.3g model GFLOP/token\n",
              blas.core.empty() ? "unknown" : blas.core.c_str(), blas.describe().c_str(),
              m.resolved.oneDnnGemm ? "; the model's GEMMs run on oneDNN" : "", at::get_num_threads(), route,
              gemmPeak / 1e9, peakSource.c_str(), allocatorName().c_str(), flopsPerToken / 1e9);
  std::printf("longtrain: %d rank(s) (sp=%d: %s, dp=%d), model %.2fM params (%lld layers, hidden %lld), data %s\n",
              g.world->size(), g.sp->size(), cfg.layout.describe().c_str(), g.dp->size(), cfg.model.numParams() / 1e6,
              (long long)cfg.model.layers, (long long)cfg.model.hidden, engine.dataset().describe().c_str());
  std::printf("longtrain: global batch %lld = micro %lld x accum %lld x dp %d, seq_len %lld, %lld steps\n",
              (long long)cfg.trainBatchSize, (long long)cfg.microBatch, (long long)cfg.gradAccum, g.dp->size(),
              (long long)cfg.data.seqLen, (long long)cfg.train.steps);
  const int L = static_cast<int>(cfg.model.layers), k = engine.graphBlocks();
  std::printf("longtrain: activation_checkpointing \"%s\": %d of %d blocks keep their graph, %d recomputed "
              "(budget %.0f MiB/rank, predicted peak %.0f MiB%s)\n",
              config::optionName(cfg.activationCheckpointing), k, L, L - k, engine.memoryBudget() / 1048576.0,
              plan::predictPeak(engine.plan().applied(cfg), g.world->size(), k).total() / 1048576.0,
              cfg.train.memoryBudget <= 0     ? ""
              : freedMemoryDecommitted() ? "; freed memory goes back to the system"
                                         : "; freed memory stays for reuse: the peak so is under half the budget");
  if (cfg.data.tokenFile() && cfg.data.evalFraction == 0 && engine.evalDataset())
    std::printf("longtrain: eval on %lld windows that training reads too (%s); data.eval_fraction holds the last "
                "windows out instead\n",
                (long long)engine.evalDataset()->size(), engine.evalDataset()->describe().c_str());
  if (cfg.data.evalFraction > 0 && engine.evalDataset())
    std::printf("longtrain: eval on %lld windows of the held-out %.1f%% (data.eval_samples caps them); unigram "
                "baseline loss %.4f (the training windows' token frequencies)\n",
                (long long)engine.evalDataset()->size(), 100 * cfg.data.evalFraction,
                data::unigramBaselineLoss(engine.dataset(), *engine.evalDataset(), cfg.model.vocabSize));
  if (printProgram) std::printf("step program:\n%s", engine.program().listing().c_str());
  std::fflush(stdout);
}

// Rank 0's --metrics file: one JSON object per optimizer step (the README's Metrics table).
class MetricsWriter {
 public:
  // A resumed run appends: the file keeps the steps before the checkpoint.
  MetricsWriter(const std::string& path, bool append, double flopsPerToken, double gemmPeak)
      : flopsPerToken_(flopsPerToken), gemmPeak_(gemmPeak) {
    if (path.empty()) return;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    LT_CHECK(out_.good(), "--metrics: cannot open '", path, "' for writing");
  }
  double mfu(double tokensPerS) const { return gemmPeak_ > 0 ? tokensPerS * flopsPerToken_ / gemmPeak_ : 0.0; }
  void write(Engine& engine, const StepMetrics& m, const EvalMetrics* e, double ckptS, const std::string& ckptError,
             const PositionLoss* byPosition) {
    if (!out_.is_open()) return;
    const double tps = m.tokens / m.stepTimeS;
    nlohmann::json j{{"step", m.step}, {"loss", m.loss}, {"lr", m.lr}, {"grad_norm", m.gradNorm},
                     {"train_accuracy", m.accuracy}, {"tokens", m.tokens}, {"step_time_s", m.stepTimeS},
                     {"tokens_per_s", tps}, {"peak_rss_bytes", m.peakRssBytes},
                     {"activation_peak_bytes", m.activationPeakBytes},
                     {"mfu", mfu(tps)}, {"model_flops_per_token", flopsPerToken_}, {"gemm_peak_flops", gemmPeak_},
                     {"skipped_steps", engine.skippedSteps()},
                     {"rss_bytes", currentRssBytes()},  // rank 0's, now (leak watch: with open_fds)
                     {"allocator_free_bytes", allocatorFreeBytes()},  // of rss_bytes (plan's baseline)
                     {"open_fds", openFileDescriptors()}};
    if (engine.activationOffload()) {
      j["offload_wait_s"] = m.offloadWaitS;
      j["offload_io_s"] = m.offloadIoS;
    }
    if (const zero::ShardedOptimizer* z = engine.zero(); z->stage() > 0) addZero(j, *z, m);  // stage 0 partitions nothing
    if (engine.zero()->stage() == 3) j["exposed_gather_s"] = m.exposedGatherS;  // only stage 3 gathers
    if (ckptS >= 0) j["checkpoint_s"] = ckptS;
    if (!ckptError.empty()) j["checkpoint_error"] = ckptError;
    if (e) {
      j["eval_loss"] = e->loss;
      j["eval_accuracy"] = e->accuracy;
    }
    if (byPosition) {  // train.eval: [[start, end, loss], ...] as longtrain eval --json has it
      j["eval_long_loss"] = byPosition->loss();
      j["eval_loss_by_position"] = nlohmann::json::array();
      for (const auto& b : byPosition->buckets)
        if (b.tokens > 0) j["eval_loss_by_position"].push_back({b.start, b.end, b.lossSum / static_cast<double>(b.tokens)});
    }
    out_ << j.dump() << "\n";
    out_.flush();
  }

 private:
  static void addZero(nlohmann::json& j, const zero::ShardedOptimizer& z, const StepMetrics& m) {
    const auto& l = z.ledger();
    j["zero_param_bytes"] = l.paramBytes;
    if (z.stage() < 3) j["zero_replica_bytes"] = l.replicaBytes;
    j["zero_grad_bytes"] = l.gradBytes;
    j["zero_optim_bytes"] = l.optimBytes;
    j["zero_rollback_bytes"] = l.rollbackBytes;
    j["zero_gathered_peak_bytes"] = l.gatheredPeakBytes;
    j["zero_unpartitioned_bytes"] = l.unpartitionedBytes;
    j["speculated_subgroups"] = m.zero.speculated;
    j["rolled_back_subgroups"] = m.zero.rolledBack;
    j["optimizer_wait_s"] = m.zero.waitSeconds;
    j["optimizer_adam_s"] = m.zero.adamSeconds;
    j["worker_adam_s"] = m.zero.workerAdamSeconds;
  }
  std::ofstream out_;
  double flopsPerToken_, gemmPeak_;
};

// Throughput leaves out the first step (allocation, thread pools), unless it is the only one.
struct Throughput {
  double elapsed = 0, tokens = 0;
  void add(const StepMetrics& m, bool counted) {
    if (!counted) return;
    elapsed += m.stepTimeS;
    tokens += static_cast<double>(m.tokens);
  }
  double tokensPerS(const StepMetrics& m) const { return elapsed > 0 ? tokens / elapsed : m.tokens / m.stepTimeS; }
};

// A save at the end of step m when the cadence or a stop asks for one; -1 seconds when none.
struct SaveOutcome {
  double seconds = -1;
  std::string error;
};
SaveOutcome maybeSave(Engine& engine, ckpt::AsyncSaver& saver, const TrainOptions& opts, int64_t step, bool stop,
                      bool lead) {
  const Config& cfg = engine.config();
  const auto& ck = cfg.train.checkpoint;
  const bool cadence = ck.everySteps > 0 && (step % ck.everySteps == 0 || step == cfg.train.steps);
  SaveOutcome out;
  if (!cadence && !(stop && !ck.dir.empty())) return out;
  auto t0 = std::chrono::steady_clock::now();
  std::string dir;
  setPhase("saving the checkpoint of step %lld", (long long)step);
  out.error = saveCheckpoint(engine, saver, opts, dir);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (lead && out.error.empty())
    std::printf("checkpoint: step %lld -> %s (%s %.2f s)\n", (long long)step, dir.c_str(),
                ck.async ? "copied in, writing in the background;" : "written in", out.seconds);
  if (lead && !out.error.empty())
    std::printf("checkpoint: step %lld FAILED: %s (train.checkpoint.on_error \"warn\": training goes on, the "
                "next save tries again)\n", (long long)step, out.error.c_str());
  return out;
}

// train.eval's line: the mean and the loss by position, one bucket after another.
void printLongEval(const PositionLoss& r, int64_t step, const Config& cfg) {
  std::string buckets;
  for (const auto& b : r.buckets)
    if (b.tokens > 0) buckets += fmt::format(" [{},{}) {:.3f}", b.start, b.end, b.lossSum / static_cast<double>(b.tokens));
  std::printf("eval-long @ step %lld: %s at %lld tokens, %lld windows: loss %.4f; by position:%s\n", (long long)step,
              cfg.train.longEval.data.c_str(), (long long)cfg.train.longEval.seqLen, (long long)r.windows, r.loss(),
              buckets.c_str());
}

void printProgress(const Config& cfg, const StepMetrics& m, double tps, double mfu, double etaS, const EvalMetrics* e) {
  if (m.step % cfg.stepsPerPrint == 0 || m.step == 1 || m.step == cfg.train.steps)
    std::printf("step %lld/%lld | loss %.4f | acc %.3f | lr %.3g | grad_norm %.3f | avg %.0f tok/s | avg MFU %.1f%% | "
                "ETA %s\n",
                (long long)m.step, (long long)cfg.train.steps, m.loss, m.accuracy, m.lr, m.gradNorm, tps, 100 * mfu,
                humanTime(etaS).c_str());
  if (e)
    std::printf("eval  %lld/%lld | loss %.4f | accuracy %.3f over %lld tokens\n", (long long)m.step,
                (long long)cfg.train.steps, e->loss, e->accuracy, (long long)e->tokens);
  std::fflush(stdout);
}

// The last async save is complete before the run reports done (or every rank says why not).
void finishAsyncSaves(ckpt::AsyncSaver& saver, const Config& cfg, comm::Comm& world, TrainSummary& sum, bool lead) {
  if (!cfg.train.checkpoint.async) return;
  auto t0 = std::chrono::steady_clock::now();
  if (const std::string e = agreedAsyncOutcome(saver, world); !e.empty()) {
    LT_CHECK(cfg.train.checkpoint.onError == config::OnSaveError::Warn, e);
    ++sum.failedSaves;
    if (lead) std::printf("checkpoint: the last save FAILED: %s\n", e.c_str());
  }
  sum.checkpointSeconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void printStop(int signal, int64_t step, const std::string& ckptDir) {
  std::printf("stop: %s after step %lld; %s\n", strsignal(signal), (long long)step,
              ckptDir.empty() ? "no checkpoint (train.checkpoint.dir is not set)"
                              : ("checkpoint saved under " + ckptDir + "; continue with --resume").c_str());
}

}  // namespace

TrainSummary runTraining(const Config& cfg, comm::Groups groups, const TrainOptions& opts) {
  const bool lead = groups.world->rank() == 0;
  if (!opts.tracePath.empty()) trace::enable(groups.world->rank());
  const auto& ck = cfg.train.checkpoint;
  if (!ck.dir.empty()) ckpt::checkWritable(ck.dir, "train.checkpoint.dir");  // a read-only dir is found now, not at the first save
  setPhase("building the model, data and optimizer (seq_len %lld)", (long long)cfg.data.seqLen);
  Engine engine(cfg, groups, opts.engine);
  if (const std::string from = resumeSource(ck, opts); !from.empty()) resume(engine, from, lead);
  std::string peakSource;
  const double gemmPeak = jobGemmPeak(engine, &peakSource), flopsPerToken = modelFlopsPerToken(cfg.model, cfg.data.seqLen);
  if (lead) printBanner(engine, gemmPeak, peakSource, flopsPerToken, opts.printProgram);
  engine.onRecompile = [&](int64_t step, const std::vector<std::string>& passes, const compile::Program& p) {
    if (lead) printRecompile(step, passes, p, opts.printProgram);
  };
  MetricsWriter metrics(lead ? opts.metricsPath : "", engine.globalStep() > 0, flopsPerToken, gemmPeak);
  TrainSummary sum;
  sum.firstStep = engine.globalStep();
  Throughput rate;
  ckpt::AsyncSaver saver;  // train.checkpoint.async
  WeightCopy weights;  // rank 0's, shared by the sampler and train.eval
  Sampler sampler(cfg);
  LongEvaluator longEval(cfg);
  for (int64_t s = engine.globalStep(); s < cfg.train.steps; ++s) {
    if (opts.faultKillStep == s && std::count(opts.faultKillRanks.begin(), opts.faultKillRanks.end(), groups.world->rank()))
      ::raise(SIGKILL);
    StepMetrics m;
    {
      trace::Scope ts("step", "step " + std::to_string(s + 1));
      setPhase("step %lld: forward, backward and optimizer", (long long)(s + 1));
      m = engine.step();
    }
    const int stop = agreedStopSignal(*groups.world);
    const SaveOutcome saved = maybeSave(engine, saver, opts, m.step, stop != 0, lead);
    sum.checkpointSeconds += std::max(0.0, saved.seconds);
    sum.failedSaves += !saved.error.empty();
    rate.add(m, s > sum.firstStep || cfg.train.steps == sum.firstStep + 1);
    const double tps = rate.tokensPerS(m);
    const bool evalNow = (cfg.train.evalEvery > 0 && m.step % cfg.train.evalEvery == 0) || m.step == cfg.train.steps;
    std::optional<EvalMetrics> e;
    if (evalNow) setPhase("evaluation after step %lld", (long long)m.step), e = engine.evaluate();
    if (e && e->tokens == 0) e.reset();  // no eval set: nothing printed or written, not a zero loss
    sampler.maybeSample(engine, weights, m.step, lead);
    const std::optional<PositionLoss> byPosition = longEval.maybeEvaluate(engine, weights, evalNow, lead);
    if (byPosition && lead) printLongEval(*byPosition, m.step, cfg);
    if (lead) {
      const double perStep = rate.elapsed > 0 ? rate.elapsed / std::max<int64_t>(1, m.step - 1 - sum.firstStep)
                                              : m.stepTimeS;
      printProgress(cfg, m, tps, metrics.mfu(tps), (cfg.train.steps - m.step) * perStep, e ? &*e : nullptr);
      metrics.write(engine, m, e ? &*e : nullptr, saved.seconds, saved.error, byPosition ? &*byPosition : nullptr);
    }
    sum.finalLoss = m.loss;
    sum.steps = m.step;
    if (e) sum.evalLoss = e->loss, sum.evalAccuracy = e->accuracy, sum.evalTokens = e->tokens;
    sum.tokensPerS = tps;
    if (stop) {
      sum.stopSignal = stop;
      if (lead) printStop(stop, m.step, ck.dir);
      break;
    }
  }
  finishAsyncSaves(saver, cfg, *groups.world, sum, lead);
  if (!opts.tracePath.empty()) {
    writeTrace(groups, opts.tracePath);
    if (lead) std::printf("trace: %s (Chrome trace-event JSON; open it in Perfetto)\n", opts.tracePath.c_str());
  }
  return sum;
}

}  // namespace lt::train
