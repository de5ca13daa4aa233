// longtrain eval's two measures. Non-obvious: the passkey answer is decoded by running the
// whole prompt through the blocks again for each new token (a handful per trial) instead of the
// KV cache, whose prefill attends through a [T, T] score matrix; the training forward's fused
// attention keeps a long prompt at O(T x tile) memory.
#include "longtrain/train/long_eval.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <random>

#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"
#include "longtrain/data/data.h"
#include "longtrain/sp/layout.h"
#include "longtrain/sp/ring_attention.h"

namespace lt::train {

namespace {

constexpr int64_t kLogitElementsPerTile = int64_t{16} << 20;  // logits formed at once: 64 MiB of fp32

// The hidden states after the last block of ids [1, S] at positions pos [1, S] (a shard of the
// sequence under SP, whose attention `sp` then is).
at::Tensor hidden(model::Model& m, const at::Tensor& ids, const at::Tensor& pos, bool packed,
                  const model::AttentionFn& sp = {}) {
  const model::AttentionFn core = sp ? sp : model::attentionCore(m.config());
  const model::AttentionFn attn = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor&) {
    return core(q, k, v, packed ? pos : at::Tensor());
  };
  at::Tensor x = m.embed(ids);
  for (int b = 0; b < m.numBlocks(); ++b) x = m.block(b, x, pos, attn);
  return x;
}

std::vector<PositionBucket> makeBuckets(int64_t seqLen) {
  std::vector<PositionBucket> b;
  for (int64_t start = 1; start < seqLen; start *= 2) b.push_back({start, std::min(start * 2, seqLen), 0, 0});
  return b;
}

// One window as a batch of one: ids, labels, positions (0..S-1 unless packed) and shift labels.
data::Batch windowBatch(const data::Sample& s) {
  const int64_t S = static_cast<int64_t>(s.ids.size());
  data::Batch b;
  b.input_ids = at::tensor(s.ids, at::kLong).view({1, S});
  b.labels = at::tensor(s.labels, at::kLong).view({1, S});
  b.position_ids = s.positions.empty() ? at::arange(S, at::kLong).view({1, S}) : at::tensor(s.positions, at::kLong).view({1, S});
  b.shift_labels = data::shiftLabels(b.labels);
  return b;
}

// Adds the per-target losses of one window (or this rank's shard of it) to `r`; a target's
// bucket is its own position, the position of the token predicting it plus one.
void addWindow(model::Model& m, const data::Batch& b, int64_t packEos, const model::AttentionFn& spAttn,
               PositionLoss& r) {
  const int64_t S = b.input_ids.size(1);
  const at::Tensor pos = b.position_ids, shift = b.shift_labels;
  const at::Tensor posFlat = pos[0].contiguous();
  const int64_t* positionsData = posFlat.data_ptr<int64_t>();
  const std::vector<int64_t> positions(positionsData, positionsData + S);
  at::Tensor h = hidden(m, b.input_ids, pos, packEos >= 0, spAttn);
  const int64_t tile = std::max<int64_t>(1, kLogitElementsPerTile / m.config().vocabSize);
  for (int64_t t0 = 0; t0 < S; t0 += tile) {
    const int64_t T = std::min(tile, S - t0);
    at::Tensor logp = at::log_softmax(m.logits(h.narrow(1, t0, T)).to(at::kFloat), -1)[0];  // [T, V]
    at::Tensor target = shift[0].narrow(0, t0, T);
    at::Tensor nll = -logp.gather(1, target.clamp_min(0).unsqueeze(1)).squeeze(1).to(at::kDouble);
    const auto* loss = nll.contiguous().data_ptr<double>();
    const auto* y = target.contiguous().data_ptr<int64_t>();
    for (int64_t i = 0; i < T; ++i) {
      if (y[i] == data::kIgnoreIndex) continue;
      const int64_t where = positions[static_cast<size_t>(t0 + i)] + 1;  // the target's own position
      r.lossSum += loss[i];
      ++r.tokens;
      for (auto& b : r.buckets)
        if (where >= b.start && where < b.end) b.lossSum += loss[i], ++b.tokens;
    }
  }
}

}  // namespace

at::Tensor lastLogits(model::Model& m, const std::vector<int64_t>& ids) {
  const int64_t S = static_cast<int64_t>(ids.size());
  at::Tensor t = at::tensor(ids, at::kLong).view({1, S});
  at::Tensor h = hidden(m, t, at::arange(S, at::kLong).view({1, S}), false);
  return m.logits(h.narrow(1, S - 1, 1))[0][0].to(at::kFloat);
}

PositionLossOptions positionLossOptions(const std::string& path, int64_t seqLen, int64_t windows,
                                        config::TokenDtype dtype, bool packDocuments, int64_t eosOverride,
                                        int64_t eosFallback, const std::string& source) {
  PositionLossOptions o;
  o.path = path, o.seqLen = seqLen, o.maxWindows = windows;
  const bool flags = source.rfind("eval ", 0) == 0;
  o.source = source;
  o.seqLenKey = flags ? "--seq-len" : "train.eval.seq_len";
  o.typeKey = flags ? "--dtype" : "train.eval.dtype";
  const std::optional<config::TokenSidecar> side = config::readTokenSidecar(path);
  LT_CHECK(dtype != config::TokenDtype::FromSidecar || side, source, " '", path, "' has no sidecar (",
           config::tokenSidecarPath(path), "); give its dtype (", o.typeKey, ": uint16 or uint32), or write the file ",
           "with longtrain tokenize");
  const bool wide = dtype == config::TokenDtype::FromSidecar ? side->dtype == "uint32" : dtype == config::TokenDtype::Uint32;
  o.bytesPerToken = wide ? 4 : 2;
  if (packDocuments) {
    o.packEos = eosOverride >= 0 ? eosOverride : side && side->eosId >= 0 ? side->eosId : eosFallback;
    LT_CHECK(o.packEos >= 0, source, " '", path, "': packed documents need the EOS id: give it (",
             flags ? "eval --eos-id" : "data.eos_id", "), or a token file written by longtrain tokenize (its sidecar names it)");
  }
  return o;
}

namespace {

// Sums every rank's counts into every rank's result.
void allReduce(PositionLoss& r, comm::Comm& world) {
  std::vector<double> v{r.lossSum, static_cast<double>(r.tokens)};
  for (const auto& b : r.buckets) v.push_back(b.lossSum), v.push_back(static_cast<double>(b.tokens));
  at::Tensor t = at::tensor(v, at::kDouble);
  world.allReduce(t).wait();
  const double* s = t.data_ptr<double>();
  r.lossSum = s[0], r.tokens = static_cast<int64_t>(s[1]);
  for (size_t i = 0; i < r.buckets.size(); ++i)
    r.buckets[i].lossSum = s[2 + 2 * i], r.buckets[i].tokens = static_cast<int64_t>(s[3 + 2 * i]);
}

}  // namespace

namespace {

std::unique_ptr<data::TokenFileDataset> openWindows(const PositionLossOptions& o, int64_t vocabSize) {
  LT_CHECK(o.seqLen >= 2, o.seqLenKey, " ", o.seqLen, ": a window needs at least 2 tokens");
  auto file = std::make_unique<data::TokenFileDataset>(o.path, o.bytesPerToken, o.seqLen, vocabSize,
                                                       data::TokenWindows{o.packEos, 0, -1, o.source, o.seqLenKey,
                                                                          o.typeKey, "the model's vocab_size"});
  LT_CHECK(file->size() > 0, o.source, " '", o.path, "' holds fewer than ", o.seqLenKey, " ", o.seqLen,
           " tokens: no whole window; give a shorter ", o.seqLenKey);
  return file;
}

}  // namespace

void checkPositionLossFile(const PositionLossOptions& o, int64_t vocabSize) { (void)openWindows(o, vocabSize); }

PositionLoss evaluatePositions(model::Model& m, const PositionLossOptions& o, const SequenceParallel* sp) {
  const auto windows = openWindows(o, m.config().vocabSize);
  const data::TokenFileDataset& file = *windows;
  const int64_t n = o.maxWindows > 0 ? std::min(o.maxWindows, file.size()) : file.size();
  PositionLoss r;
  r.buckets = makeBuckets(o.seqLen);
  const bool split = sp && sp->groups.sp->size() > 1;
  model::AttentionFn spAttn;
  if (split)
    spAttn = sp::sequenceParallelAttention(sp->groups.spUlysses, sp->groups.spRing, sp->layout, sp->groups.sp->rank(),
                                           model::attentionCore(m.config()), m.config().attentionChunk, nullptr,
                                           m.config().slidingWindow, {}, model::attentionInBf16(m.config()));
  at::NoGradGuard ng;
  for (int64_t w = 0; w < n; ++w) {
    const data::Sample s = file.get(w);
    for (int64_t id : s.ids)
      LT_CHECK(id >= 0 && id < m.config().vocabSize, o.source, " '", o.path, "': token id ", id,
               " is outside the model's vocabulary (", m.config().vocabSize, "); was it written with this model's ",
               "tokenizer?");
    const data::Batch whole = windowBatch(s);
    addWindow(m, split ? sp::shardBatch(whole, sp->groups.sp->rank(), sp->layout) : whole, o.packEos, spAttn, r);
    ++r.windows;
  }
  if (split) allReduce(r, *sp->groups.world);
  return r;
}

std::vector<int64_t> needlePrompt(const data::Tokenizer& tok, int64_t length, double depth, const std::string& key,
                                  int64_t startToken) {
  const auto enc = [&](const std::string& s) { return tok.encode(s); };
  const std::vector<int64_t> intro = enc(
      "There is an important piece of information hidden inside a lot of irrelevant text. Find it and "
      "memorize it. I will quiz you about it.\n");
  const std::vector<int64_t> filler =
      enc(" The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.");
  const std::vector<int64_t> needle = enc(" The pass key is " + key + ". Remember it. " + key + " is the pass key.");
  const std::vector<int64_t> question = enc("\nWhat is the pass key? The pass key is");
  const int64_t fixed = (startToken >= 0 ? 1 : 0) + static_cast<int64_t>(intro.size() + needle.size() + question.size());
  const int64_t repeats = std::max<int64_t>(0, (length - fixed) / static_cast<int64_t>(filler.size()));
  const int64_t before = std::llround(std::clamp(depth, 0.0, 1.0) * static_cast<double>(repeats));
  std::vector<int64_t> p;
  if (startToken >= 0) p.push_back(startToken);
  p.insert(p.end(), intro.begin(), intro.end());
  for (int64_t i = 0; i < repeats; ++i) {
    if (i == before) p.insert(p.end(), needle.begin(), needle.end());
    p.insert(p.end(), filler.begin(), filler.end());
  }
  if (before >= repeats) p.insert(p.end(), needle.begin(), needle.end());
  p.insert(p.end(), question.begin(), question.end());
  return p;
}

bool needleAnswered(const std::string& answer, const std::string& key) {
  const auto first = std::find_if(answer.begin(), answer.end(), [](unsigned char c) { return std::isdigit(c); });
  const auto last = std::find_if(first, answer.end(), [](unsigned char c) { return !std::isdigit(c); });
  return std::string(first, last) == key;
}

std::vector<NeedleCell> needleGrid(model::Model& m, const data::Tokenizer& tok, const NeedleOptions& o) {
  LT_CHECK(!o.lengths.empty() && !o.depths.empty() && o.trials > 0, "eval --needle needs --lengths, --depths and ",
           "--trials >= 1");
  std::mt19937_64 rng(o.seed);
  std::vector<NeedleCell> cells;
  at::NoGradGuard ng;
  for (int64_t length : o.lengths)
    for (double depth : o.depths) {
      NeedleCell c{length, depth, 0, o.trials, 0};
      for (int t = 0; t < o.trials; ++t) {
        std::string key = std::to_string(1 + rng() % 9);  // no leading zero
        while (static_cast<int>(key.size()) < o.digits) key += std::to_string(rng() % 10);
        std::vector<int64_t> ids = needlePrompt(tok, length, depth, key, o.startToken);
        c.promptTokens += static_cast<int64_t>(ids.size());
        const size_t promptSize = ids.size();
        const int64_t budget = static_cast<int64_t>(tok.encode(" " + key + ".").size()) + 2;
        for (int64_t k = 0; k < budget; ++k) {
          const int64_t next = lastLogits(m, ids).argmax().item<int64_t>();
          if (next == tok.eosId()) break;
          ids.push_back(next);
        }
        const std::string answer = tok.decode({ids.begin() + static_cast<std::ptrdiff_t>(promptSize), ids.end()});
        c.correct += needleAnswered(answer, key) ? 1 : 0;
      }
      c.promptTokens /= o.trials;
      cells.push_back(c);
    }
  return cells;
}

}  // namespace lt::train
