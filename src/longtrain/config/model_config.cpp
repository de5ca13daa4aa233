// Parameter counts of the Llama shape (the layout model/model.cpp builds).
#include "longtrain/config/model_config.h"

namespace lt::config {

int64_t ModelConfig::blockParams() const {
  const int64_t kvDim = kvHeads * headDim();
  // input and post-attention norms; q and o; k and v; gate, up and down.
  return 2 * hidden + 2 * hidden * hidden + 2 * hidden * kvDim + 3 * hidden * intermediate;
}

}  // namespace lt::config
