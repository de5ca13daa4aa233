// Datasets, permutations, loaders. All randomness is splitmix64 of (seed, index) so any
// sample or epoch is reproducible on its own, on any rank, in any order.
#include "longtrain/data/data.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "longtrain/config/validate.h"
#include "longtrain/core/check.h"
#include "longtrain/core/files.h"

namespace lt::data {

namespace {
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s;
  uint64_t next() { return s = splitmix64(s); }
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }
};
}  // namespace

at::Tensor shiftLabels(const at::Tensor& labels) {
  auto pad = at::full({labels.size(0), 1}, kIgnoreIndex, labels.options());
  return at::cat({labels.slice(1, 1), pad}, 1).contiguous();
}

// ---------------------------------------------------------------------------- KV recall
KvRecallDataset::KvRecallDataset(KvRecallOptions o) : o_(o) {
  config::checkKvRecall(o_.seqLen, o_.numPairs, o_.numQueries, o_.numKeys, o_.numValues, o_.numNoise);
}

Sample KvRecallDataset::get(int64_t i) const {
  LT_ASSERT(i >= 0 && i < o_.numSamples);
  const int64_t kBos = 0, keyBase = 2, valBase = keyBase + o_.numKeys, noiseBase = valBase + o_.numValues;
  const int64_t fusedBase = noiseBase + o_.numNoise;
  Rng rng{splitmix64(o_.seed ^ splitmix64(static_cast<uint64_t>(i) + 1))};
  std::vector<int64_t> keys(o_.numKeys);
  std::iota(keys.begin(), keys.end(), 0);
  for (int64_t k = 0; k < o_.numPairs; ++k) std::swap(keys[k], keys[k + rng.below(o_.numKeys - k)]);
  std::vector<int64_t> vals(o_.numPairs);
  for (auto& v : vals) v = rng.below(o_.numValues);

  Sample s;
  s.ids.reserve(o_.seqLen);
  s.ids.push_back(kBos);
  for (int64_t k = 0; k < o_.numPairs; ++k) {
    if (o_.fused) {
      s.ids.push_back(fusedBase + keys[k] * o_.numValues + vals[k]);
      continue;
    }
    s.ids.push_back(keyBase + keys[k]);
    s.ids.push_back(valBase + vals[k]);
  }
  int64_t filler = o_.seqLen - static_cast<int64_t>(s.ids.size()) - 2 * o_.numQueries;
  for (int64_t f = 0; f < filler; ++f) s.ids.push_back(noiseBase + rng.below(o_.numNoise));
  s.labels.assign(s.ids.size(), kIgnoreIndex);
  for (int64_t q = 0; q < o_.numQueries; ++q) {
    int64_t k = rng.below(o_.numPairs);
    s.ids.push_back(keyBase + keys[k]);
    s.labels.push_back(kIgnoreIndex);
    s.ids.push_back(valBase + vals[k]);
    s.labels.push_back(valBase + vals[k]);
  }
  LT_ASSERT(static_cast<int64_t>(s.ids.size()) == o_.seqLen);
  return s;
}

std::string KvRecallDataset::describe() const {
  return std::string(o_.fused ? "kv_recall[fused]" : "kv_recall") + "(seq_len=" + std::to_string(o_.seqLen) + ", pairs=" + std::to_string(o_.numPairs) +
         ", queries=" + std::to_string(o_.numQueries) + ", chance=1/" + std::to_string(o_.numValues) + ")";
}

// ---------------------------------------------------------------------------- token files
TokenFileDataset::TokenFileDataset(const std::string& path, int bytesPerToken, int64_t seqLen, int64_t vocabSize,
                                   TokenWindows windows)
    : path_(path), bytesPerToken_(bytesPerToken), seqLen_(seqLen), vocab_(vocabSize), w_(windows) {
  LT_CHECK(bytesPerToken == 1 || bytesPerToken == 2 || bytesPerToken == 4, "token width must be 1, 2 or 4 bytes");
  LT_CHECK(seqLen >= 1, w_.seqLenKey, "=", seqLen, " must be at least 1");
  LT_CHECK(vocabSize >= 1, "model.vocab_size=", vocabSize, " must be at least 1");
  const int fd = openInputFile(path, w_.source + "='" + path + "'");
  struct stat st {};
  ::fstat(fd, &st);
  mapBytes_ = static_cast<size_t>(st.st_size);
  numTokens_ = static_cast<int64_t>(mapBytes_ / bytesPerToken);
  if (mapBytes_ % bytesPerToken != 0 || numTokens_ < seqLen) {
    ::close(fd);
    LT_CHECK(mapBytes_ % bytesPerToken == 0, w_.source, "='", path, "': size ", mapBytes_,
             " bytes is not a multiple of the token width ", bytesPerToken, " (wrong ", w_.typeKey, "?)");
    LT_CHECK(false, w_.source, "='", path, "' holds ", numTokens_, " tokens, fewer than one window of ", w_.seqLenKey,
             "=", seqLen);
  }
  const int64_t all = numTokens_ / seqLen_;
  numWindows_ = w_.numWindows < 0 ? all - w_.firstWindow : w_.numWindows;
  if (w_.firstWindow < 0 || numWindows_ < 1 || w_.firstWindow + numWindows_ > all) {
    ::close(fd);
    LT_CHECK(false, w_.source, "='", path, "' holds ", all, " windows of ", w_.seqLenKey, "=", seqLen, "; windows [",
             w_.firstWindow, ", ", w_.firstWindow + numWindows_,
             ") were asked for (lower data.eval_fraction or ", w_.seqLenKey, ", or supply more data)");
  }
  void* p = ::mmap(nullptr, mapBytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  LT_CHECK(p != MAP_FAILED, w_.source, "='", path, "': mmap failed: ", std::strerror(errno));
  map_ = static_cast<const uint8_t*>(p);
}

TokenFileDataset::~TokenFileDataset() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), mapBytes_);
}

Sample TokenFileDataset::get(int64_t i) const {
  LT_ASSERT(i >= 0 && i < size());
  Sample s;
  s.ids.resize(seqLen_);
  const int64_t window = w_.firstWindow + i;
  const uint8_t* base = map_ + static_cast<size_t>(window * seqLen_) * bytesPerToken_;
  for (int64_t t = 0; t < seqLen_; ++t) {
    uint32_t v = 0;
    if (bytesPerToken_ == 1) v = base[t];
    else if (bytesPerToken_ == 2) { uint16_t x; std::memcpy(&x, base + 2 * t, 2); v = x; }
    else std::memcpy(&v, base + 4 * t, 4);
    LT_CHECK(bytesPerToken_ == 1 || static_cast<int64_t>(v) < vocab_, w_.source, "='", path_, "': token ", v,
             " at index ", window * seqLen_ + t, " is outside ", w_.vocabKey, "=", vocab_, "; check ", w_.typeKey,
             " (uint16 vs uint32), and that the file was written with the model's tokenizer");
    s.ids[t] = v;
  }
  s.labels = s.ids;
  if (w_.packEos >= 0) packDocuments(s, w_.packEos);
  return s;
}

void packDocuments(Sample& s, int64_t eosId) {
  const size_t n = s.ids.size();
  s.positions.resize(n);
  int64_t pos = 0;
  for (size_t t = 0; t < n; ++t) {
    if (t > 0 && s.ids[t - 1] == eosId) {
      pos = 0;
      s.labels[t] = kIgnoreIndex;
    }
    s.positions[t] = pos++;
  }
}

std::string TokenFileDataset::describe() const {
  return "tokens(" + path_ + ", " + std::to_string(numTokens_) + " tokens, windows [" + std::to_string(w_.firstWindow) +
         ", " + std::to_string(w_.firstWindow + size()) + ")" + (w_.packEos >= 0 ? ", packed documents" : "") + ")";
}

double unigramBaselineLoss(const Dataset& train, const Dataset& eval, int64_t vocab) {
  std::vector<double> counts(static_cast<size_t>(vocab), 1.0);  // add-one
  double total = static_cast<double>(vocab);
  // At most ~16M tokens are counted (evenly spaced windows): the start-up line must not read
  // a many-GB corpus; every window counts in files below that.
  const int64_t most = std::max<int64_t>(1, (int64_t{1} << 24) / std::max<int64_t>(1, train.seqLen()));
  const int64_t stride = (train.size() + most - 1) / most;
  for (int64_t i = 0; i < train.size(); i += stride)
    for (int64_t t : train.get(i).ids) {
      counts[static_cast<size_t>(t)] += 1;
      total += 1;
    }
  double loss = 0;
  int64_t n = 0;
  const int64_t evalStride = (eval.size() + most - 1) / most;  // the same bound for the eval set
  for (int64_t i = 0; i < eval.size(); i += evalStride) {
    const Sample s = eval.get(i);
    for (size_t t = 1; t < s.labels.size(); ++t) {  // the targets of positions 0..S-2
      if (s.labels[t] == kIgnoreIndex) continue;
      loss -= std::log(counts[static_cast<size_t>(s.labels[t])] / total);
      ++n;
    }
  }
  return n ? loss / static_cast<double>(n) : 0.0;
}

// ---------------------------------------------------------------------------- sampling
std::vector<int64_t> epochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  Rng rng{splitmix64(seed * 0x100000001B3ull + static_cast<uint64_t>(epoch) + 7)};
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(i + 1)]);
  return p;
}

Loader::Loader(std::shared_ptr<const Dataset> ds, LoaderOptions o) : ds_(std::move(ds)), o_(o) {
  globalBatch_ = o_.microBatch * o_.gradAccum * o_.dpSize;
  stepsPerEpoch_ = ds_->size() / globalBatch_;
  LT_CHECK(stepsPerEpoch_ >= 1, "the dataset (", ds_->describe(), ") has ", ds_->size(),
           " samples, fewer than one global batch of train_batch_size=", globalBatch_,
           "; lower train_batch_size or supply more data");
}

std::vector<int64_t> Loader::indicesAt(int64_t streamIndex) const {
  int64_t step = streamIndex / o_.gradAccum, j = streamIndex % o_.gradAccum;
  int64_t epoch = step / stepsPerEpoch_, inEpoch = step % stepsPerEpoch_;
  if (epoch != cachedEpoch_) {
    perm_ = epochPermutation(ds_->size(), o_.seed, epoch);
    cachedEpoch_ = epoch;
  }
  int64_t off = inEpoch * globalBatch_ + (j * o_.dpSize + o_.dpRank) * o_.microBatch;
  return {perm_.begin() + off, perm_.begin() + off + o_.microBatch};
}

std::vector<int64_t> Loader::peekIndices() const { return indicesAt(cursor_ * o_.spSize + o_.spRank); }

Batch Loader::next() {
  auto idx = peekIndices();
  ++cursor_;
  std::vector<Sample> samples;
  samples.reserve(idx.size());
  for (auto i : idx) samples.push_back(ds_->get(i));
  return collate(samples);
}

Batch collate(const std::vector<Sample>& samples) {
  LT_ASSERT(!samples.empty());
  int64_t b = static_cast<int64_t>(samples.size()), s = static_cast<int64_t>(samples[0].ids.size());
  Batch out;
  out.input_ids = at::empty({b, s}, at::kLong);
  out.labels = at::empty({b, s}, at::kLong);
  auto* ids = out.input_ids.data_ptr<int64_t>();
  auto* lab = out.labels.data_ptr<int64_t>();
  out.position_ids = at::arange(s, at::kLong).unsqueeze(0).expand({b, s}).contiguous();
  auto* pos = out.position_ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    LT_ASSERT(static_cast<int64_t>(samples[i].ids.size()) == s);
    std::copy(samples[i].ids.begin(), samples[i].ids.end(), ids + i * s);
    std::copy(samples[i].labels.begin(), samples[i].labels.end(), lab + i * s);
    if (!samples[i].positions.empty()) {
      LT_ASSERT(static_cast<int64_t>(samples[i].positions.size()) == s);
      std::copy(samples[i].positions.begin(), samples[i].positions.end(), pos + i * s);
    }
  }
  return out;
}

}  // namespace lt::data
