// The run plan (see run_plan.h).
#include "longtrain/config/run_plan.h"

namespace lt::config {

std::vector<std::pair<std::string, double>> RunPlan::agreedFields() const {
  return {{"model.gemm (resolved: onednn)", kernels.oneDnnGemm ? 1.0 : 0.0},
          {"bf16.enabled (resolved: bf16 GEMMs)", kernels.bf16Gemms ? 1.0 : 0.0},
          {"bf16.attention (resolved: bf16 attention products)", kernels.bf16Attention ? 1.0 : 0.0},
          {"data.packing (documents)", kernels.packedDocuments ? 1.0 : 0.0},
          {"activation_checkpointing (blocks keeping their graph)", static_cast<double>(graphBlocks)}};
}

ModelConfig RunPlan::model(const ModelConfig& m) const {
  ModelConfig out = m;
  out.resolved = kernels;
  return out;
}

Config RunPlan::applied(const Config& c) const {
  Config out = c;
  out.model = model(c.model);
  return out;
}

}  // namespace lt::config
