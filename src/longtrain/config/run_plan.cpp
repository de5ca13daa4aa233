// The run plan (see run_plan.h).
#include "longtrain/config/run_plan.h"

namespace lt::config {

std::vector<std::pair<std::string, double>> RunPlan::agreedFields() const {
  return {{"model.gemm (resolved: onednn)", oneDnnGemm ? 1.0 : 0.0},
          {"bf16.enabled (resolved: bf16 GEMMs)", bf16Compute ? 1.0 : 0.0},
          {"data.packing (documents)", packedDocuments ? 1.0 : 0.0},
          {"activation_checkpointing (blocks keeping their graph)", static_cast<double>(graphBlocks)}};
}

ModelConfig RunPlan::model(const ModelConfig& m) const {
  ModelConfig out = m;
  out.oneDnnGemm = oneDnnGemm;
  out.bf16Compute = bf16Compute;
  out.packedDocuments = packedDocuments;
  return out;
}

Config RunPlan::applied(const Config& c) const {
  Config out = c;
  out.model = model(c.model);
  return out;
}

}  // namespace lt::config
