// Parameter counts of the Llama shape (the layout model/model.cpp builds).
#include "longtrain/config/model_config.h"

#include <cmath>

namespace lt::config {

double RopeScaling::attentionScale() const {
  if (type != RopeType::Yarn) return 1;
  if (attentionFactor > 0) return attentionFactor;
  const auto m = [&](double scale) { return factor <= 1 ? 1.0 : 0.1 * scale * std::log(factor) + 1.0; };
  return mscale > 0 && mscaleAllDim > 0 ? m(mscale) / m(mscaleAllDim) : m(1.0);
}

int64_t ModelConfig::blockParams() const {
  const int64_t kvDim = kvHeads * headDim();
  // input and post-attention norms; q and o; k and v; gate, up and down.
  const int64_t base = 2 * hidden + 2 * hidden * qDim() + 2 * hidden * kvDim + 3 * hidden * intermediate;
  return base + (qkvBias() ? qDim() + 2 * kvDim : 0) + (oBias() ? hidden : 0) + (qkNorm ? 2 * headDim() : 0);
}

}  // namespace lt::config
