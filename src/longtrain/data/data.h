// Datasets and per-rank sampling. A Batch holds Hugging Face-style fields: `labels` are
// NOT shifted (label i is token i, -100 = ignored); the trainer (or the Ulysses adapter)
// forms `shift_labels` (label i = target predicted at position i).
// Sampling: every epoch is a permutation of all samples drawn from the seed alone, cut into
// global batches of train_batch_size samples; the order never depends on the rank count,
// so 1 rank with accumulation and N ranks without it see the same samples.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lt::data {

constexpr int64_t kIgnoreIndex = -100;

struct Batch {
  at::Tensor input_ids;     // [B, S] int64
  at::Tensor labels;        // [B, S] int64, unshifted
  at::Tensor position_ids;  // [B, S] int64
  at::Tensor shift_labels;  // [B, S] int64, or undefined until formed
};

// Right-pads labels with one -100 and drops the first: shift[i] = labels[i+1].
at::Tensor shiftLabels(const at::Tensor& labels);

struct Sample {
  std::vector<int64_t> ids, labels;  // labels unshifted, kIgnoreIndex where not scored
  std::vector<int64_t> positions;    // position ids; empty: 0..S-1
};

// Document packing (Hugging Face's DataCollatorWithFlattening convention): a document runs
// up to and including its EOS; position ids restart at 0 after every EOS, and the first
// token after an EOS gets label -100, so no token is predicted from another document.
// Attention reads the boundaries back from the positions (model::documentStartFromPositions).
void packDocuments(Sample& s, int64_t eosId);

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t seqLen() const = 0;
  virtual int64_t vocabNeeded() const = 0;  // smallest vocab_size that covers every token
  virtual Sample get(int64_t i) const = 0;
  virtual std::string describe() const = 0;
};

// Key-value recall over a long context (multi-query associative recall). A sample is
// BOS, n distinct (key, value) pairs, filler noise, then q queries (key, value) drawn from
// the pairs; only the values of the queries are scored. The answer lies ~seq_len tokens
// back, so accuracy rises above chance (1/num_values) only when attention learns to find it.
// With `fused`, each stored pair is one token (key*num_values + value): one attention layer
// can then retrieve it by content; the split form needs a two-layer induction circuit,
// which takes far longer to emerge than a 3-minute quick start allows.
struct KvRecallOptions {
  int64_t seqLen = 256, numSamples = 100000, numPairs = 16, numQueries = 32;
  int64_t numKeys = 32, numValues = 16, numNoise = 16;
  bool fused = false;
  uint64_t seed = 1234;
};
class KvRecallDataset : public Dataset {
 public:
  explicit KvRecallDataset(KvRecallOptions o);
  int64_t size() const override { return o_.numSamples; }
  int64_t seqLen() const override { return o_.seqLen; }
  int64_t vocabNeeded() const override {
    return 2 + o_.numKeys + o_.numValues + o_.numNoise + (o_.fused ? o_.numKeys * o_.numValues : 0);
  }
  Sample get(int64_t i) const override;
  std::string describe() const override;

 private:
  KvRecallOptions o_;
};

// A flat little-endian array of uint16 or uint32 tokens (llm.c / nanoGPT .bin without header,
// or raw bytes with bytesPerToken = 1), memory-mapped, cut into non-overlapping windows.
// With packEos >= 0 each window is packed (packDocuments) at that separator. The dataset is
// windows [firstWindow, firstWindow + numWindows) of the file (numWindows -1: to the end), so
// a held-out split is a range the training range excludes.
// Errors name the file, window length, dtype and vocabulary by the user's words: source (the
// key or flag that gave the file), seqLenKey, typeKey and vocabKey.
struct TokenWindows {
  int64_t packEos = -1, firstWindow = 0, numWindows = -1;
  std::string source = "data.path", seqLenKey = "data.seq_len", typeKey = "data.type", vocabKey = "model.vocab_size";
};
class TokenFileDataset : public Dataset {
 public:
  TokenFileDataset(const std::string& path, int bytesPerToken, int64_t seqLen, int64_t vocabSize,
                   TokenWindows windows = {});
  ~TokenFileDataset() override;
  int64_t size() const override { return numWindows_; }
  int64_t fileWindows() const { return numTokens_ / seqLen_; }
  int64_t seqLen() const override { return seqLen_; }
  int64_t vocabNeeded() const override { return bytesPerToken_ == 1 ? 256 : vocab_; }
  Sample get(int64_t i) const override;
  std::string describe() const override;

 private:
  std::string path_;
  int bytesPerToken_;
  int64_t seqLen_, vocab_, numTokens_ = 0, numWindows_ = 0;
  TokenWindows w_;
  const uint8_t* map_ = nullptr;
  size_t mapBytes_ = 0;
};

// The loss a model knowing only token frequencies reaches: the mean cross-entropy (nats) of
// `eval`'s scored tokens under `train`'s unigram distribution (add-one smoothed over `vocab`;
// counted over at most ~16M tokens of evenly spaced training windows, and scored over as many
// of the eval set's).
// The baseline a language model's eval loss must fall clearly below.
double unigramBaselineLoss(const Dataset& train, const Dataset& eval, int64_t vocab);

// Deterministic permutation of [0, n) for an epoch (Fisher-Yates on splitmix64).
std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch);

struct LoaderOptions {
  int64_t microBatch = 1, gradAccum = 1;
  int dpRank = 0, dpSize = 1;  // data-parallel position (SP groups count once)
  int spRank = 0, spSize = 1;  // rank within the SP group: it loads every spSize-th micro-batch
  uint64_t seed = 1234;
};

// The infinite stream of micro-batches of one rank. The DP group's stream is: for each
// global step t, for each accumulation step j, the micro-batch at offset (j*dpSize + dpRank)
// of global batch t. An SP rank takes stream elements spRank, spRank+spSize, ... so the
// Ulysses adapter, which serves its ranks' batches in rank order, restores the stream.
class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> ds, LoaderOptions o);
  Batch next();
  int64_t cursor() const { return cursor_; }  // micro-batches taken so far
  void seek(int64_t cursor) { cursor_ = cursor; }
  int64_t stepsPerEpoch() const { return stepsPerEpoch_; }
  // The sample indices of this rank's next micro-batch (without taking it).
  std::vector<int64_t> peekIndices() const;

 private:
  std::vector<int64_t> indicesAt(int64_t streamIndex) const;
  std::shared_ptr<const Dataset> ds_;
  LoaderOptions o_;
  int64_t globalBatch_, stepsPerEpoch_, cursor_ = 0;
  mutable int64_t cachedEpoch_ = -1;
  mutable std::vector<int64_t> perm_;
};

// Stacks samples into a Batch (position_ids 0..S-1 where a sample has none).
Batch collate(const std::vector<Sample>& samples);

}  // namespace lt::data
