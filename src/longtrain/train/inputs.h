// Every input file a rank reads, opened and checked once by the launcher before any rank is
// spawned, so that a bad file prints its error once, not once per rank. Non-obvious: it runs
// the ranks' own readers (the datasets, the tokenizer, model.init_from's safetensors headers,
// train.eval's token file), so it refuses exactly what they would, in the same words.
#pragma once
#include "longtrain/config/config.h"

namespace lt::train {

// lt::Error as a rank would throw it. Reads headers and sidecars, maps token files; never the
// model's weights.
void checkInputs(const config::Config& cfg);

}  // namespace lt::train
