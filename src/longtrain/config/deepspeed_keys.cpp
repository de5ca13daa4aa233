// The table of DeepSpeed keys longtrain settles before parsing, and the walk that applies it.
#include "longtrain/config/deepspeed_keys.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "longtrain/config/config.h"

namespace lt::config {

using json = nlohmann::json;

namespace {

// A value at which a key changes nothing; null in the table: every value is a no-op.
using Neutral = bool (*)(const json&);
bool isObject(const json& v) { return v.is_object(); }
bool isFalse(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool isTrue(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool isOne(const json& v) { return v.is_number() && v.get<double>() == 1.0; }
bool isMinusOne(const json& v) { return v.is_number() && v.get<double>() == -1.0; }
bool notPositive(const json& v) { return v.is_number() && v.get<double>() <= 0; }
bool isFp32(const json& v) { return v.is_string() && (v == "fp32" || v == "float32"); }
bool switchedOff(const json& v) { return v.is_object() && (!v.contains("enabled") || isFalse(v["enabled"])); }
bool hostMemory(const json& v) {
  return v.is_object() && (!v.contains("device") || v["device"] == "none" || v["device"] == "cpu");
}

struct DeepSpeedKey {
  const char* path;
  Neutral neutral;
  const char* noEffect;  // why it changes nothing here, at a neutral value
  const char* refusal;   // why another value is refused (unused when `neutral` is null)
  Neutral form = nullptr;  // the entry covers only values of this form (null: every value)
};

constexpr const char* kFeature = "changes the training and is not implemented in longtrain";

const DeepSpeedKey kKeys[] = {
    // Reporting and bookkeeping.
    {"wall_clock_breakdown", nullptr, "per-op times: --trace", nullptr},
    {"memory_breakdown", nullptr, "memory: longtrain plan and the metrics' peak RSS", nullptr},
    {"flops_profiler", nullptr, "MFU is on the progress line", nullptr},
    {"tensorboard", nullptr, "metrics go to the run's metrics file (longtrain plot)", nullptr},
    {"wandb", nullptr, "metrics go to the run's metrics file (longtrain plot)", nullptr},
    {"csv_monitor", nullptr, "metrics go to the run's metrics file (longtrain plot)", nullptr},
    {"comet", nullptr, "metrics go to the run's metrics file (longtrain plot)", nullptr},
    {"dump_state", nullptr, "longtrain config CONFIG --print shows the effective config", nullptr},
    {"checkpoint", nullptr, "checkpoints are set under train.checkpoint", nullptr},
    {"aio", nullptr, "NVMe I/O settings; nothing is offloaded to NVMe", nullptr},
    {"zero_allow_untested_optimizer", nullptr, "longtrain's Adam(W) is its own kernel", nullptr},
    {"zero_force_ds_cpu_optimizer", nullptr, "longtrain's Adam(W) is its own kernel", nullptr},
    {"pipeline", nullptr, "applies to DeepSpeed's PipelineModule only; longtrain has no pipeline stages", nullptr},
    {"activation_checkpointing", nullptr,
     "longtrain recomputes whole blocks as the memory budget needs (activation_checkpointing \"auto\"); "
     "cpu_checkpointing's counterpart is train.offload_dir",
     nullptr, isObject},  // DeepSpeed's object; longtrain's own value is a string
    // Precision. fp16 itself is refused by the parser; its loss-scaling knobs mean nothing without it.
    {"fp16.loss_scale", nullptr, "fp16 is off", nullptr},
    {"fp16.loss_scale_window", nullptr, "fp16 is off", nullptr},
    {"fp16.initial_scale_power", nullptr, "fp16 is off", nullptr},
    {"fp16.hysteresis", nullptr, "fp16 is off", nullptr},
    {"fp16.consecutive_hysteresis", nullptr, "fp16 is off", nullptr},
    {"fp16.min_loss_scale", nullptr, "fp16 is off", nullptr},
    {"fp16.auto_cast", nullptr, "fp16 is off", nullptr},
    {"fp16.fp16_master_weights_and_grads", nullptr, "fp16 is off", nullptr},
    {"amp", switchedOff, "off", "Apex AMP (fp16 mixed precision) is not implemented; use bf16.enabled"},
    {"data_types.grad_accum_dtype", isFp32, "gradients accumulate in fp32",
     "gradients accumulate in fp32 here; remove the key"},
    {"prescale_gradients", isFalse, "off",
     "scaling gradients before the sum changes its rounding; longtrain averages once, after the sum"},
    {"gradient_predivide_factor", isOne, "1 divides nothing",
     "dividing gradients before the sum changes its rounding; longtrain averages once, after the sum"},
    {"sparse_gradients", isFalse, "off", "sparse embedding gradients are not implemented"},
    // Features that would change the results.
    {"sparse_attention", nullptr, nullptr, nullptr},  // refused below, whatever its value
    {"compression_training", switchedOff, "off", kFeature},
    {"quantize_training", switchedOff, "off", kFeature},
    {"progressive_layer_drop", switchedOff, "off", kFeature},
    {"curriculum_learning", switchedOff, "off", kFeature},
    {"data_efficiency", switchedOff, "off", kFeature},
    {"eigenvalue", switchedOff, "off", kFeature},
    {"elasticity", switchedOff, "off", "elastic batch sizes are not implemented"},
    // Optimizer and scheduler details.
    {"optimizer.params.torch_adam", nullptr, "longtrain's Adam(W) is its own kernel", nullptr},
    {"optimizer.params.amsgrad", isFalse, "off", "AMSGrad is not implemented"},
    {"optimizer.params.bias_correction", isTrue, "on, as always here", "Adam without bias correction is not implemented"},
    {"scheduler.params.last_batch_iteration", isMinusOne, "a resumed run takes its step from the checkpoint",
     "a resumed run takes its step from the checkpoint (train --resume); remove the key"},
    // ZeRO's knobs for paths longtrain does not have.
    {"zero_optimization.stage3_max_reuse_distance", nullptr,
     "a gathered block is released after its last use in the step program", nullptr},
    {"zero_optimization.stage3_gather_16bit_weights_on_model_save", nullptr,
     "longtrain export always writes the whole model", nullptr},
    {"zero_optimization.stage3_gather_fp16_weights_on_model_save", nullptr,
     "longtrain export always writes the whole model", nullptr},
    {"zero_optimization.stage3_module_granularity_threshold", nullptr, "parameters are gathered per block", nullptr},
    {"zero_optimization.allgather_partitions", nullptr, "partitions are always all-gathered", nullptr},
    {"zero_optimization.load_from_fp32_weights", nullptr, "checkpoints hold the fp32 masters", nullptr},
    {"zero_optimization.ignore_unused_parameters", nullptr, "the model uses every parameter", nullptr},
    {"zero_optimization.memory_efficient_linear", nullptr, "longtrain's GEMMs save what backward needs", nullptr},
    {"zero_optimization.use_multi_rank_bucket_allreduce", nullptr, "one bucket all-reduce per bucket", nullptr},
    {"zero_optimization.offload_optimizer.pin_memory", nullptr, "a CPU build has no device copies to pin", nullptr},
    {"zero_optimization.offload_optimizer.buffer_count", nullptr, "NVMe settings; offload is to CPU memory", nullptr},
    {"zero_optimization.offload_optimizer.fast_init", nullptr, "NVMe settings; offload is to CPU memory", nullptr},
    {"zero_optimization.offload_optimizer.pipeline_read", nullptr, "NVMe settings; offload is to CPU memory", nullptr},
    {"zero_optimization.offload_optimizer.pipeline_write", nullptr, "NVMe settings; offload is to CPU memory", nullptr},
    {"zero_optimization.offload_optimizer.nvme_path", nullptr, "NVMe settings; offload is to CPU memory", nullptr},
    {"zero_optimization.offload_param", hostMemory,
     "a CPU build keeps parameters in host memory (stage 3 shards them)",
     "NVMe parameter offload is not implemented; stage 3 shards parameters, and train.offload_dir moves "
     "activations to disk"},
    {"zero_optimization.cpu_offload", isFalse, "off",
     "DeepSpeed's legacy key: write zero_optimization.offload_optimizer.device = \"cpu\" instead"},
    {"zero_optimization.zero_quantized_weights", isFalse, "off", "ZeRO++ quantized weights change the numerics; not implemented"},
    {"zero_optimization.zero_quantized_nontrainable_weights", isFalse, "off",
     "ZeRO++ quantized weights change the numerics; not implemented"},
    {"zero_optimization.zero_quantized_gradients", isFalse, "off",
     "ZeRO++ quantized gradients change the numerics; not implemented"},
    {"zero_optimization.zero_hpz_partition_size", isOne, "1: one partition level",
     "ZeRO++ hierarchical partitioning is not implemented"},
    {"zero_optimization.mics_shard_size", notPositive, "off", "MiCS sharding is not implemented"},
};

// The keys whose value "auto" longtrain reads as its own choice, not as the Trainer's blank.
constexpr const char* kOwnAutoKeys[] = {"activation_checkpointing", "sequence_parallel_balance",
                                        "sequence_parallel_ulysses_head_groups"};
constexpr const char* kOwnSections[] = {"model", "data", "train", "compile"};
// "auto" keys whose value derives from other keys (the rest take longtrain's default).
constexpr const char* kBatchKeys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                      "gradient_accumulation_steps"};

json* findPath(json& j, const std::string& path, json** parent, std::string* leaf) {
  json* node = &j;
  std::stringstream ss(path);
  std::string part;
  json* up = nullptr;
  while (std::getline(ss, part, '.')) {
    if (!node->is_object() || !node->contains(part)) return nullptr;
    up = node;
    node = &(*node)[part];
    *leaf = part;
  }
  *parent = up;
  return node->is_null() ? nullptr : node;
}

// Every "auto" value outside longtrain's own sections and auto-valued keys, removed.
void removeAutos(json& node, const std::string& path, std::vector<std::string>& out) {
  if (!node.is_object()) return;
  for (auto it = node.begin(); it != node.end();) {
    const std::string key = path.empty() ? it.key() : path + "." + it.key();
    const bool own = path.empty() && (std::count(std::begin(kOwnSections), std::end(kOwnSections), key) > 0 ||
                                       std::count(std::begin(kOwnAutoKeys), std::end(kOwnAutoKeys), key) > 0);
    if (!own && *it == "auto") {
      out.push_back(key);
      it = node.erase(it);
      continue;
    }
    if (!own) removeAutos(*it, key, out);
    ++it;
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// DeepSpeed matches optimizer and scheduler names without regard to case.
void canonicalName(json& j, const char* section, std::initializer_list<const char*> names) {
  if (!j.contains(section) || !j[section].is_object() || !j[section].contains("type")) return;
  json& type = j[section]["type"];
  if (!type.is_string()) return;
  const std::string given = lower(type.get<std::string>());
  for (const char* n : names)
    if (lower(n) == given) type = n;
}

// The Trainer's all-"auto" batch: longtrain's micro batch of 1, accumulation 1.
void completeAutoBatch(json& j, const std::vector<std::string>& autos) {
  bool anyAuto = false, anyLeft = false;
  for (const char* k : kBatchKeys) {
    anyAuto |= std::count(autos.begin(), autos.end(), k) > 0;
    anyLeft |= j.contains(k) && !j[k].is_null();
  }
  if (anyAuto && !anyLeft) j["train_micro_batch_size_per_gpu"] = 1;
}

// total_num_steps "auto" (the decaying schedules): the run's train.steps.
void completeAutoTotalSteps(json& j, const std::vector<std::string>& autos) {
  if (std::count(autos.begin(), autos.end(), "scheduler.params.total_num_steps") == 0) return;
  const json& type = j["scheduler"]["type"];
  if (type == "WarmupLR") return;  // it has no end
  const json* steps = j.contains("train") && j["train"].is_object() && j["train"].contains("steps")
                          ? &j["train"]["steps"]
                          : nullptr;
  j["scheduler"]["params"]["total_num_steps"] = steps ? *steps : json(TrainSection{}.steps);
}

}  // namespace

PortNotes settleDeepSpeedKeys(json& j, Problems& problems) {
  PortNotes notes;
  if (!j.is_object()) return notes;
  canonicalName(j, "optimizer", {"Adam", "AdamW", "Lamb", "OneBitAdam", "ZeroOneAdam", "OneBitLamb", "Adagrad", "Lion",
                                 "MuAdam", "MuAdamW", "MuSGD"});
  canonicalName(j, "scheduler", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "LRRangeTest", "OneCycle"});
  removeAutos(j, "", notes.autoKeys);
  completeAutoBatch(j, notes.autoKeys);
  completeAutoTotalSteps(j, notes.autoKeys);
  for (const auto& k : kKeys) {
    json* parent = nullptr;
    std::string leaf;
    json* v = findPath(j, k.path, &parent, &leaf);
    if (!v || (k.form && !k.form(*v))) continue;
    if (std::string(k.path) == "sparse_attention")
      problems.add("config key 'sparse_attention': block-sparse attention changes which tokens attend to which; "
                   "longtrain's attention is dense causal (model.sliding_window gives Mistral's window); remove the key");
    else if (!k.neutral || k.neutral(*v))
      notes.ignored.push_back(std::string(k.path) + " (" + k.noEffect + ")");
    else
      problems.add("config key '" + std::string(k.path) + "' = " + v->dump() + ": " + k.refusal);
    parent->erase(leaf);
  }
  return notes;
}

std::vector<std::string> portNotices(const PortNotes& notes, const json& effective) {
  std::vector<std::string> out;
  if (!notes.autoKeys.empty()) {
    std::string line = "config: \"auto\" taken as";
    for (const auto& k : notes.autoKeys) {
      std::string pointer = "/" + k;
      std::replace(pointer.begin(), pointer.end(), '.', '/');
      const json::json_pointer p(pointer);
      const bool known = effective.contains(p) && !effective[p].is_null();
      line += (&k == &notes.autoKeys.front() ? " " : ", ") + k + "=" +
              (known ? effective[p].dump() : std::string("longtrain's default"));
    }
    out.push_back(line + " (derived from the other keys where they determine it, else longtrain's default)");
  }
  if (!notes.ignored.empty()) {
    std::string line = "config: DeepSpeed keys with no effect in longtrain, ignored:";
    for (const auto& k : notes.ignored) line += (&k == &notes.ignored.front() ? " " : "; ") + k;
    out.push_back(line);
  }
  return out;
}

}  // namespace lt::config
