// The run plan (see run_plan.h).
#include "longtrain/config/run_plan.h"

namespace lt::config {

std::vector<std::pair<std::string, double>> RunPlan::agreedFields() const {
  return {{"model.gemm (resolved: onednn)", kernels.oneDnnGemm ? 1.0 : 0.0},
          {"bf16.enabled (resolved: bf16 GEMMs)", kernels.bf16Gemms ? 1.0 : 0.0},
          {"bf16.attention (resolved: bf16 attention products)", kernels.bf16Attention ? 1.0 : 0.0},
          {"data.packing (documents)", kernels.packedDocuments ? 1.0 : 0.0},
          {"activation_checkpointing (blocks keeping their graph)", static_cast<double>(graphBlocks)},
          {"model.loss_chunk (resolved from \"auto\")", static_cast<double>(lossChunk)},
          {"model.tiled_mlp (resolved from \"auto\")", tiledMlp ? 1.0 : 0.0}};
}

ModelConfig RunPlan::model(const ModelConfig& m) const {
  ModelConfig out = m;
  out.resolved = kernels;
  if (m.lossChunkAuto) out.lossChunk = lossChunk;
  if (m.tiledMlpAuto) out.tiledMlp = tiledMlp;
  return out;
}

Config RunPlan::applied(const Config& c) const {
  Config out = c;
  out.model = model(c.model);
  return out;
}

}  // namespace lt::config
