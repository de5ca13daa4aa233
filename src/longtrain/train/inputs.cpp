// checkInputs (see inputs.h).
#include "longtrain/train/inputs.h"

#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/train/engine.h"
#include "longtrain/train/long_eval.h"

namespace lt::train {

namespace {

// train.eval's token file, as LongEvaluator and evaluatePositions open it.
void checkLongEvalFile(const config::Config& cfg) {
  const auto& e = cfg.train.longEval;
  if (e.data.empty()) return;
  const PositionLossOptions o = positionLossOptions(e.data, e.seqLen, e.windows, e.dtype, e.packing == config::Packing::Documents, -1,
                                                    cfg.data.eosId, "train.eval.data");
  checkPositionLossFile(o, cfg.model.vocabSize);
}

}  // namespace

void checkInputs(const config::Config& cfg) {
  const auto train = makeDataset(cfg, false);  // token file, sidecar, tokenizer against the vocabulary
  if (cfg.data.evalSamples > 0) (void)makeDataset(cfg, true);
  data::LoaderOptions lo;  // at least one global batch
  lo.microBatch = cfg.microBatch, lo.gradAccum = cfg.gradAccum, lo.dpSize = cfg.layout.dp;
  lo.spSize = cfg.layout.P;
  (void)data::Loader(train, lo);
  if (!cfg.model.initFrom.empty()) (void)ckpt::HfWeights(cfg.model.initFrom, "model.init_from");
  checkLongEvalFile(cfg);
}

}  // namespace lt::train
