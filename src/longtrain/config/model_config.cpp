// Parameter counts of the Llama shape (the layout model/model.cpp builds).
#include "longtrain/config/model_config.h"

#include <cmath>

namespace lt::config {

double RopeScaling::attentionScale() const {
  if (type != "yarn") return 1;
  if (attentionFactor > 0) return attentionFactor;
  const auto m = [&](double scale) { return factor <= 1 ? 1.0 : 0.1 * scale * std::log(factor) + 1.0; };
  return mscale > 0 && mscaleAllDim > 0 ? m(mscale) / m(mscaleAllDim) : m(1.0);
}

int64_t ModelConfig::blockParams() const {
  const int64_t kvDim = kvHeads * headDim();
  // input and post-attention norms; q and o; k and v; gate, up and down.
  return 2 * hidden + 2 * hidden * hidden + 2 * hidden * kvDim + 3 * hidden * intermediate;
}

}  // namespace lt::config
