// liblongtrain_sentencepiece.so: SentencePiece behind the C functions of spm_shim.h, loaded
// isolated by data/tokenizer.cpp (see spm_shim.h for why). Non-obvious: nothing here may throw
// or hand out memory; results are copied into the caller's buffers.
#include "longtrain/data/spm/spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <unordered_map>
#include <vector>

struct LtSpm {
  sentencepiece::SentencePieceProcessor sp;
};

namespace {

int fail(const std::string& message, char* err, size_t errCap) {
  if (err && errCap > 0) {
    const size_t n = std::min(message.size(), errCap - 1);
    std::memcpy(err, message.data(), n);
    err[n] = '\0';
  }
  return -1;
}

template <class T>
int copyOut(const T* data, size_t n, T* out, size_t cap, size_t* needed) {
  *needed = n;
  if (n > cap) return 1;
  if (n > 0) std::memcpy(out, data, n * sizeof(T));
  return 0;
}

}  // namespace

extern "C" {

LtSpm* ltspm_load(const char* path, char* err, size_t errCap) {
  try {
    auto* m = new LtSpm;
    const auto st = m->sp.Load(path);
    if (st.ok()) return m;
    fail(st.ToString(), err, errCap);
    delete m;
  } catch (const std::exception& e) {
    fail(e.what(), err, errCap);
  }
  return nullptr;
}

void ltspm_free(LtSpm* m) { delete m; }
int ltspm_piece_size(const LtSpm* m) { return m->sp.GetPieceSize(); }
int ltspm_bos_id(const LtSpm* m) { return m->sp.bos_id(); }
int ltspm_eos_id(const LtSpm* m) { return m->sp.eos_id(); }
int ltspm_is_byte(const LtSpm* m, int id) { return m->sp.IsByte(id) ? 1 : 0; }

int ltspm_piece(const LtSpm* m, int id, char* buf, size_t cap, size_t* needed) {
  const std::string& p = m->sp.IdToPiece(id);
  return copyOut(p.data(), p.size(), buf, cap, needed);
}

int ltspm_encode(const LtSpm* m, const char* text, size_t len, int* ids, size_t cap, size_t* needed, char* err,
                 size_t errCap) {
  try {
    std::vector<int> v;
    const auto st = m->sp.Encode(absl::string_view(text, len), &v);
    if (!st.ok()) return fail(st.ToString(), err, errCap);
    return copyOut(v.data(), v.size(), ids, cap, needed);
  } catch (const std::exception& e) {
    return fail(e.what(), err, errCap);
  }
}

int ltspm_decode(const LtSpm* m, const int* ids, size_t n, char* text, size_t cap, size_t* needed, char* err,
                 size_t errCap) {
  try {
    std::string s;
    const auto st = m->sp.Decode(std::vector<int>(ids, ids + n), &s);
    if (!st.ok()) return fail(st.ToString(), err, errCap);
    return copyOut(s.data(), s.size(), text, cap, needed);
  } catch (const std::exception& e) {
    return fail(e.what(), err, errCap);
  }
}

int ltspm_train(const char* const* keys, const char* const* values, size_t n, unsigned seed, char* err,
                size_t errCap) {
  try {
    std::unordered_map<std::string, std::string> flags;
    for (size_t i = 0; i < n; ++i) flags[keys[i]] = values[i];
    sentencepiece::SetRandomGeneratorSeed(seed);
    const auto st = sentencepiece::SentencePieceTrainer::Train(flags);
    return st.ok() ? 0 : fail(st.ToString(), err, errCap);
  } catch (const std::exception& e) {
    return fail(e.what(), err, errCap);
  }
}

}  // extern "C"
