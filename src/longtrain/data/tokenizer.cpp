// SentencePiece behind lt::data::Tokenizer, its trainer, and the streaming text-to-token-file
// writer; SentencePiece itself is liblongtrain_sentencepiece.so, loaded isolated at first use
// (data/spm/spm_shim.h says why). Non-obvious: a document longer than kChunkBytes is encoded in
// chunks cut after a newline, each continuation as "\n" + chunk with encode("\n")'s ids dropped,
// so it gets exactly the ids it has inside the whole document (no dummy-prefix space), and one
// huge document neither builds a lattice of gigabytes nor leaves the second thread idle.
#include "longtrain/data/tokenizer.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <thread>
#include <unordered_map>

#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"
#include "longtrain/core/files.h"
#include "longtrain/core/sha256.h"
#include "longtrain/data/hf_tokenizer.h"
#include "longtrain/data/spm/spm_shim.h"

namespace lt::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kChunkBytes = size_t{64} << 10;  // the unit one Encode call gets, at most (cut at a newline)
constexpr size_t kBatchBytes = size_t{1} << 20;   // text encoded between two writes of the output
constexpr int kEncodeThreads = 2;
constexpr size_t kMaxSentenceBytes = 16384;        // the trainer's max_sentence_length; longer lines are cut
constexpr int64_t kMaxTrainingSentences = 2000000;  // input_sentence_size: a shuffled sample beyond this
constexpr unsigned kTrainSeed = 1234;               // sentence sampling and shuffling: deterministic
constexpr int kSpecialPieces = 3;                   // unk, bos, eos
constexpr int kBytePieces = 256;
constexpr double kProgressIntervalS = 0.2;

bool isBlank(std::string_view s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v') return false;
  return true;
}

// A text file to tokenize: a regular file (a FIFO would block, /dev/zero never end).
void checkInputFile(const std::string& path) { lt::checkInputFile(path, "input '" + path + "'"); }

std::string readTextFile(const std::string& path) { return lt::readInputFile(path, "input '" + path + "'"); }

// The cut of `s` at or before `limit` bytes: after the last space, else on a UTF-8 boundary.
size_t cutBefore(std::string_view s, size_t limit) {
  if (s.size() <= limit) return s.size();
  const size_t space = s.rfind(' ', limit - 1);
  if (space != std::string_view::npos && space > 0) return space + 1;
  size_t cut = limit;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return cut > 0 ? cut : limit;
}

// A file removed when this goes out of scope, unless committed by renaming it.
class TempFile {
 public:
  explicit TempFile(fs::path p) : path_(std::move(p)) {}
  ~TempFile() {
    std::error_code ec;
    if (!path_.empty()) fs::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const fs::path& path() const { return path_; }
  void renameTo(const fs::path& to) {
    std::error_code ec;
    fs::rename(path_, to, ec);
    LT_CHECK(!ec, "cannot rename '", path_.string(), "' to '", to.string(), "': ", ec.message());
    path_.clear();
  }

 private:
  fs::path path_;
};

// ---------------------------------------------------------------------------- the shim

// The shim's functions, resolved with dlsym.
struct SpmLibrary {
#define LTSPM_POINTER(f) decltype(&::f) f = nullptr;
  LTSPM_FUNCTIONS(LTSPM_POINTER)
#undef LTSPM_POINTER
};

constexpr const char* kShimName = "liblongtrain_sentencepiece.so";

// Where the shim may be: $LONGTRAIN_SENTENCEPIECE_SHIM, beside the executable, the build's.
std::vector<std::string> shimCandidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("LONGTRAIN_SENTENCEPIECE_SHIM"); env && *env) c.push_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) c.push_back((exe.parent_path() / kShimName).string());
#ifdef LONGTRAIN_SENTENCEPIECE_SHIM_PATH
  c.push_back(LONGTRAIN_SENTENCEPIECE_SHIM_PATH);
#endif
  return c;
}

SpmLibrary openShim() {
  std::string tried;
  for (const auto& path : shimCandidates()) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      tried += "\n  " + path + ": not there";
      continue;
    }
    // LOCAL: its protobuf stays out of the global scope; DEEPBIND: it binds to its own first.
    void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!h) {
      tried += "\n  " + path + ": " + ::dlerror();
      continue;
    }
    SpmLibrary lib;
    bool complete = true;
#define LTSPM_RESOLVE(f)                                                  \
  lib.f = reinterpret_cast<decltype(&::f)>(::dlsym(h, #f));                \
  if (!lib.f) complete = false;
    LTSPM_FUNCTIONS(LTSPM_RESOLVE)
#undef LTSPM_RESOLVE
    if (complete) return lib;
    tried += "\n  " + path + ": lacks some ltspm_ functions (an old build?)";
  }
  LT_CHECK(false, "cannot load SentencePiece (", kShimName, ", built with longtrain by scripts/build.sh); tried:",
           tried, "\nrebuild, or set LONGTRAIN_SENTENCEPIECE_SHIM to the file's path");
  return {};
}

const SpmLibrary& spm() {
  static const SpmLibrary lib = openShim();
  return lib;
}

// Calls f(buffer, capacity, &needed, err, errCap) with a buffer of `guess` elements, again with
// `needed` if that was too small; returns the result or throws lt::Error with `what` and the message.
template <class T, class F>
std::vector<T> callSized(size_t guess, const F& f, const std::string& what) {
  std::vector<T> out(std::max<size_t>(guess, 1));
  char err[1024] = "";
  size_t needed = 0;
  int rc = f(out.data(), out.size(), &needed, err, sizeof err);
  if (rc == 1) {
    out.resize(needed);
    rc = f(out.data(), out.size(), &needed, err, sizeof err);
  }
  LT_CHECK(rc == 0, what, ": ", err);
  out.resize(needed);
  return out;
}

}  // namespace

std::vector<std::string_view> splitDocuments(std::string_view text, const std::string& splitOn) {
  std::vector<std::string_view> docs;
  auto add = [&](std::string_view d) {
    if (!isBlank(d)) docs.push_back(d);
  };
  if (splitOn.empty()) {
    add(text);
    return docs;
  }
  size_t begin = 0;
  for (size_t at; (at = text.find(splitOn, begin)) != std::string_view::npos; begin = at + splitOn.size())
    add(text.substr(begin, at - begin));
  add(text.substr(begin));
  return docs;
}

// ---------------------------------------------------------------------------- Tokenizer

namespace {

// A loaded SentencePiece model.
struct SpmModel {
  const SpmLibrary& lib = spm();
  LtSpm* model = nullptr;
  std::vector<int> newlineIds;  // encode("\n"): dropped from the front of a continuation chunk
  bool chunkable = false;       // no piece spans a newline and the normalizer keeps it

  ~SpmModel() {
    if (model) lib.ltspm_free(model);
  }
  std::vector<int> encodeRaw(std::string_view text, const std::string& path) const {
    // Byte fallback bounds the count: at most one id per byte, plus the dummy prefix's.
    return callSized<int>(
        text.size() + 8,
        [&](int* ids, size_t cap, size_t* needed, char* err, size_t errCap) {
          return lib.ltspm_encode(model, text.data(), text.size(), ids, cap, needed, err, errCap);
        },
        detail::concat("tokenizer '", path, "' failed to encode ", text.size(), " bytes"));
  }
  std::string decodeRaw(const std::vector<int>& ids, const std::string& path) const {
    const std::vector<char> text = callSized<char>(
        ids.size() * 8 + 16,
        [&](char* buf, size_t cap, size_t* needed, char* err, size_t errCap) {
          return lib.ltspm_decode(model, ids.data(), ids.size(), buf, cap, needed, err, errCap);
        },
        detail::concat("tokenizer '", path, "' failed to decode ", ids.size(), " ids"));
    return {text.begin(), text.end()};
  }
  std::string piece(int id) const {
    char buf[256];
    size_t needed = 0;
    if (lib.ltspm_piece(model, id, buf, sizeof buf, &needed) == 0) return {buf, needed};
    std::string big(needed, '\0');
    lib.ltspm_piece(model, id, big.data(), big.size(), &needed);
    return big;
  }
  // The ids of `chunk` as they are inside a document where it follows a newline.
  std::vector<int> encodeContinuation(std::string_view chunk, const std::string& path) const {
    std::string s = "\n";
    s.append(chunk);
    std::vector<int> ids = encodeRaw(s, path);
    LT_ASSERT(ids.size() >= newlineIds.size() && std::equal(newlineIds.begin(), newlineIds.end(), ids.begin()));
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(newlineIds.size()));
    return ids;
  }
  void findWhetherChunkable(const std::string& path) {
    for (int i = 0; i < lib.ltspm_piece_size(model); ++i)
      if (!lib.ltspm_is_byte(model, i) && piece(i).find('\n') != std::string::npos) return;
    newlineIds = encodeRaw("\n", path);
    chunkable = decodeRaw(newlineIds, path) == "\n";
  }
  // After the last newline within `limit`, else after the first beyond it (a long line: its end).
  size_t cutBefore(std::string_view doc, size_t limit) const {
    if (!chunkable) return std::string_view::npos;
    size_t newline = doc.rfind('\n', limit - 1);
    if (newline == std::string_view::npos) newline = doc.find('\n', limit);
    return newline == std::string_view::npos ? newline : newline + 1;
  }
};

std::unique_ptr<SpmModel> loadSpm(const std::string& path) {
  auto m = std::make_unique<SpmModel>();
  char err[1024] = "";
  m->model = m->lib.ltspm_load(path.c_str(), err, sizeof err);
  LT_CHECK(m->model, "tokenizer '", path, "' is neither a SentencePiece model (", err, ") nor a tokenizer.json; ",
           "give a .model file written by SentencePiece or a Hugging Face tokenizer.json");
  m->findWhetherChunkable(path);
  return m;
}

bool looksLikeJson(const std::string& path) {
  if (fs::path(path).extension() == ".json") return true;
  std::ifstream f(path, std::ios::binary);
  char c = 0;
  while (f.get(c) && (c == ' ' || c == '\n' || c == '\r' || c == '\t')) {
  }
  return c == '{';
}

}  // namespace

// One of the two kinds, and the per-thread state tokenizeFiles' workers keep.
struct Tokenizer::Impl {
  std::unique_ptr<SpmModel> spm;
  std::unique_ptr<HfTokenizer> hf;
  HfTokenizer::ScratchPtr scratch() const { return hf ? hf->newScratch() : nullptr; }
  size_t cutBefore(std::string_view doc, size_t limit) const {
    return hf ? hf->cutBefore(doc, limit) : spm->cutBefore(doc, limit);
  }
  // The ids of one unit of tokenizeFiles: a document or the part of one after a cut.
  std::vector<int> encodeUnit(std::string_view text, bool continuation, HfTokenizer::Scratch* s,
                              const std::string& path) const {
    if (hf) return hf->encode(text, s);
    return continuation ? spm->encodeContinuation(text, path) : spm->encodeRaw(text, path);
  }
};

std::string Tokenizer::resolve(const std::string& path) {
  std::error_code ec;
  const fs::path p(path);
  LT_CHECK(fs::exists(p, ec), "tokenizer '", path, "' does not exist (absolute: '", fs::absolute(p, ec).string(),
           "'); give a tokenizer.json, a SentencePiece .model, or a model directory holding one");
  if (!fs::is_directory(p, ec)) return path;
  for (const char* name : {"tokenizer.json", "tokenizer.model"})
    if (fs::is_regular_file(p / name, ec)) return (p / name).string();
  LT_CHECK(false, "directory '", path, "' holds neither tokenizer.json nor tokenizer.model");
  return path;
}

Tokenizer::Tokenizer(const std::string& path) : impl_(std::make_unique<Impl>()), path_(resolve(path)) {
  std::error_code ec;
  LT_CHECK(fs::is_regular_file(path_, ec), "tokenizer '", path_, "' is not a regular file; give a tokenizer.json, ",
           "a SentencePiece .model file (longtrain tokenize --train-tokenizer N --tokenizer ", path_,
           " trains one), or a model directory");
  if (!looksLikeJson(path_)) {
    impl_->spm = loadSpm(path_);
    return;
  }
  try {
    impl_->hf = std::make_unique<HfTokenizer>(path_);
  } catch (const Error&) {
    // A directory's tokenizer.json that is not byte-level BPE (Llama 2, Mistral): its tokenizer.model.
    const fs::path model = fs::path(path_).parent_path() / "tokenizer.model";
    if (!fs::is_directory(path, ec) || !fs::is_regular_file(model, ec)) throw;
    path_ = model.string();
    impl_->spm = loadSpm(path_);
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

int64_t Tokenizer::vocabSize() const {
  return impl_->hf ? impl_->hf->vocabSize() : impl_->spm->lib.ltspm_piece_size(impl_->spm->model);
}
int64_t Tokenizer::eosId() const { return impl_->hf ? impl_->hf->eosId() : impl_->spm->lib.ltspm_eos_id(impl_->spm->model); }
int64_t Tokenizer::bosId() const { return impl_->hf ? impl_->hf->bosId() : impl_->spm->lib.ltspm_bos_id(impl_->spm->model); }
std::string Tokenizer::tokenText(int64_t id) const {
  if (id < 0) return "";
  return impl_->hf ? impl_->hf->decode({static_cast<int>(id)}) : impl_->spm->piece(static_cast<int>(id));
}
const std::string& Tokenizer::path() const { return path_; }
std::string Tokenizer::kind() const { return impl_->hf ? "tokenizer.json" : "sentencepiece"; }

std::vector<int64_t> Tokenizer::encode(const std::string& text) const {
  const std::vector<int> ids = impl_->hf ? impl_->hf->encode(text, nullptr) : impl_->spm->encodeRaw(text, path_);
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    LT_CHECK(ids[i] >= 0 && ids[i] < vocabSize(), "token id ", ids[i], " at position ", i,
             " is outside tokenizer '", path_, "' (vocabulary ", vocabSize(), ")");
    narrow.push_back(static_cast<int>(ids[i]));
  }
  return impl_->hf ? impl_->hf->decode(narrow) : impl_->spm->decodeRaw(narrow, path_);
}

// ---------------------------------------------------------------------------- training

namespace {

// Writes every line of every document of `inputs` to `out`, one training sentence a line
// (lines longer than kMaxSentenceBytes cut). Returns the sentence count.
int64_t writeTrainingSentences(const std::vector<std::string>& inputs, const std::string& splitOn,
                               std::ofstream& out) {
  int64_t sentences = 0;
  for (const auto& path : inputs) {
    const std::string text = readTextFile(path);
    for (std::string_view doc : splitDocuments(text, splitOn)) {
      for (size_t begin = 0; begin < doc.size();) {
        size_t end = doc.find('\n', begin);
        if (end == std::string_view::npos) end = doc.size();
        for (std::string_view line = doc.substr(begin, end - begin); !line.empty();) {
          const size_t cut = cutBefore(line, kMaxSentenceBytes);
          if (!isBlank(line.substr(0, cut))) {
            out.write(line.data(), static_cast<std::streamsize>(cut)).put('\n');
            ++sentences;
          }
          line.remove_prefix(cut);
        }
        begin = end + 1;
      }
    }
  }
  return sentences;
}

// SentencePiece's "Vocabulary size is smaller than required_chars. 200 vs 287." as advice.
std::string trainingError(const std::string& message, int64_t vocabSize) {
  const std::string needle = "smaller than required_chars. ";
  const size_t at = message.find(needle);
  if (at != std::string::npos) {
    const size_t vs = message.find(" vs ", at);
    const std::string need = vs == std::string::npos ? "more" : std::to_string(std::atoll(message.c_str() + vs + 4));
    return detail::concat("vocabulary size ", vocabSize, " is too small for this corpus: it needs the ", kBytePieces,
                          " byte-fallback pieces, ", kSpecialPieces,
                          " special pieces and every frequent character (", need,
                          " in all); train with a vocabulary of at least ", need);
  }
  return "SentencePiece training failed: " + message;
}

}  // namespace

void trainTokenizer(const std::vector<std::string>& inputs, int64_t vocabSize, const std::string& outPrefix,
                    const std::string& splitOn, const std::string& modelType) {
  LT_CHECK(!inputs.empty(), "training a tokenizer needs at least one input text file");
  LT_CHECK(modelType == "unigram" || modelType == "bpe", "tokenizer model type '", modelType,
           "' is not known; use \"unigram\" or \"bpe\"");
  const int64_t minimum = kBytePieces + kSpecialPieces + 1;
  LT_CHECK(vocabSize >= minimum && vocabSize <= (int64_t{1} << 30), "vocabulary size ", vocabSize,
           " is out of range: byte fallback alone takes ", kBytePieces + kSpecialPieces,
           " pieces (256 bytes, unk, bos, eos); use at least ", minimum, " plus the corpus's characters");
  const fs::path prefix(outPrefix);
  const fs::path dir = prefix.has_parent_path() ? prefix.parent_path() : fs::path(".");
  std::error_code ec;
  LT_CHECK(fs::is_directory(dir, ec), "cannot write tokenizer '", outPrefix, ".model': directory '", dir.string(),
           "' does not exist");
  for (const auto& p : inputs) checkInputFile(p);

  static std::atomic<int> counter{0};
  const fs::path tmpDir = fs::temp_directory_path(ec);
  LT_CHECK(!ec, "the temporary directory is not usable (", ec.message(), "); set TMPDIR to a directory this user ",
           "can write (training a tokenizer writes its sentences there)");
  TempFile sentences(tmpDir / ("longtrain-tokenizer-" + std::to_string(::getpid()) + "-" +
                                                  std::to_string(counter++) + ".txt"));
  int64_t count = 0;
  {
    std::ofstream out(sentences.path(), std::ios::binary);
    LT_CHECK(out.is_open(), "cannot write the training sentences to '", sentences.path().string(),
             "': ", std::strerror(errno));
    count = writeTrainingSentences(inputs, splitOn, out);
    out.close();
    LT_CHECK(out.good(), "cannot write the training sentences to '", sentences.path().string(), "'");
  }
  LT_CHECK(count > 0, "the inputs hold no text to train a tokenizer on (", inputs.size(), " file(s), all blank)");

  const char* log = std::getenv("LONGTRAIN_SENTENCEPIECE_LOG");
  const std::unordered_map<std::string, std::string> flags = {
      {"input", sentences.path().string()},
      {"model_prefix", outPrefix},
      {"model_type", modelType},
      {"vocab_size", std::to_string(vocabSize)},
      {"hard_vocab_limit", "false"},  // a small corpus may not fill the vocabulary: smaller, not an error
      {"character_coverage", "0.9995"},  // rarer characters go to byte fallback
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},  // with the two below: decode(encode(x)) == x
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"split_digits", "true"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"max_sentence_length", std::to_string(kMaxSentenceBytes)},
      {"input_sentence_size", std::to_string(kMaxTrainingSentences)},
      {"shuffle_input_sentence", "true"},
      {"num_threads", std::to_string(kEncodeThreads)},
      {"minloglevel", log && *log && std::string(log) != "0" ? "0" : "2"},
  };
  std::vector<const char*> keys, values;
  for (const auto& [k, v] : flags) {
    keys.push_back(k.c_str());
    values.push_back(v.c_str());
  }
  char err[2048] = "";
  const int rc = spm().ltspm_train(keys.data(), values.data(), keys.size(), kTrainSeed, err, sizeof err);
  LT_CHECK(rc == 0, trainingError(err, vocabSize));
  LT_CHECK(fs::is_regular_file(outPrefix + ".model", ec), "SentencePiece reported success but wrote no '",
           outPrefix, ".model'");
}

// ---------------------------------------------------------------------------- token files

namespace {

// One Encode call's text: a whole document, or a chunk of one.
struct Unit {
  std::string_view text;
  bool continuation = false;  // follows a newline inside its document
  bool endsDocument = false;  // EOS follows it
};


// The flat output file: ids as uint16 or uint32 little-endian, written to <path>.tmp and
// renamed into place by commit(); removed if never committed.
class TokenFileWriter {
 public:
  TokenFileWriter(const std::string& path, int bytesPerToken)
      : path_(path), tmp_(fs::path(path + ".tmp")), bytesPerToken_(bytesPerToken) {
    static_assert(std::endian::native == std::endian::little, "token files are little-endian");
    out_.open(tmp_.path(), std::ios::binary | std::ios::trunc);
    LT_CHECK(out_.is_open(), "cannot write token file '", tmp_.path().string(), "': ", std::strerror(errno),
             " (does its directory exist?)");
  }
  void write(const std::vector<int>& ids) {
    if (bytesPerToken_ == 2) writeAs<uint16_t>(ids);
    else writeAs<uint32_t>(ids);
  }
  void commit() {
    out_.close();
    LT_CHECK(out_.good(), "writing token file '", tmp_.path().string(), "' failed (disk full?)");
    tmp_.renameTo(path_);
  }

 private:
  template <class T>
  void writeAs(const std::vector<int>& ids) {
    buffer_.resize(ids.size() * sizeof(T));
    T* p = reinterpret_cast<T*>(buffer_.data());
    for (size_t i = 0; i < ids.size(); ++i) p[i] = static_cast<T>(ids[i]);
    out_.write(buffer_.data(), static_cast<std::streamsize>(buffer_.size()));
    LT_CHECK(out_.good(), "writing token file '", tmp_.path().string(), "' failed (disk full?)");
  }
  std::string path_;
  TempFile tmp_;
  int bytesPerToken_;
  std::ofstream out_;
  std::vector<char> buffer_;
};

// The stderr progress line: live (carriage return, every kProgressIntervalS) on a terminal or
// when forced; the final summary always.
class Progress {
 public:
  explicit Progress(bool live) : live_(live), start_(Clock::now()), last_(start_) {}
  double seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  void update(const TokenizeResult& r) {
    if (!live_) return;
    const auto now = Clock::now();
    if (std::chrono::duration<double>(now - last_).count() < kProgressIntervalS) return;
    last_ = now;
    std::fprintf(stderr, "\r%s   ", line(r).c_str());
    std::fflush(stderr);
  }
  void finish(const TokenizeResult& r, const std::string& out) {
    std::fprintf(stderr, "%s%s in %.2f s -> %s\n", live_ ? "\r" : "", line(r).c_str(), r.seconds, out.c_str());
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::string line(const TokenizeResult& r) const {
    const double s = std::max(seconds(), 1e-9);
    char buf[256];
    std::snprintf(buf, sizeof buf, "tokenize: %lld documents, %lld tokens, %.1f MB read, %.0f tokens/s",
                  (long long)r.documents, (long long)r.tokens, r.bytesRead / 1e6, r.tokens / s);
    return buf;
  }
  bool live_;
  Clock::time_point start_, last_;
};

}  // namespace

namespace {

// tokenizer.json takes UTF-8 only (as Hugging Face's, whose Python strings cannot hold other bytes).
void checkUtf8(std::string_view text, const std::string& path) {
  const size_t bad = firstInvalidUtf8(text);
  if (bad == std::string_view::npos) return;
  const auto line = 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(bad), '\n');
  LT_CHECK(false, "input '", path, "' is not valid UTF-8: byte ", bad, " (line ", line, ") begins no UTF-8 ",
           "character; a tokenizer.json takes UTF-8 text (convert the file first, e.g. iconv -f latin1 -t utf-8)");
}

// Commits the token file and its sidecar F.bin.json; a stale sidecar is removed first, so a
// token file is never beside a sidecar that describes another.
void commitWithSidecar(TokenFileWriter& out, const TokenizeOptions& o, const Tokenizer& tok, const TokenizeResult& r) {
  config::TokenSidecar s;
  s.dtype = r.bytesPerToken == 2 ? "uint16" : "uint32";
  std::error_code ec;
  s.tokenizer = fs::absolute(tok.path(), ec).string();
  s.tokenizerKind = tok.kind();
  s.tokenizerSha256 = sha256File(tok.path());
  s.vocabSize = r.vocabSize, s.eosId = r.eosId, s.bosId = tok.bosId();
  s.documents = r.documents, s.tokens = r.tokens;
  for (const auto& in : o.inputs) s.inputs.push_back(fs::absolute(in, ec).string());
  s.splitOn = o.splitOn;
  const std::string sidecar = config::tokenSidecarPath(o.outPath);
  TempFile tmp(fs::path(sidecar + ".tmp"));
  {
    std::ofstream f(tmp.path(), std::ios::binary | std::ios::trunc);
    f << config::tokenSidecarJson(s);
    f.close();
    LT_CHECK(f.good(), "cannot write '", tmp.path().string(), "' (disk full?)");
  }
  fs::remove(sidecar, ec);
  out.commit();
  tmp.renameTo(sidecar);
}

}  // namespace

// The one door from the writer into the tokenizer's SentencePiece state (chunked encoding).
struct TokenizerAccess {
  static const Tokenizer::Impl& impl(const Tokenizer& t) { return *t.impl_; }
};

namespace {

void appendUnits(std::string_view doc, const Tokenizer& tok, std::vector<Unit>& units) {
  for (bool first = true; !doc.empty(); first = false) {
    size_t cut = doc.size() > kChunkBytes ? TokenizerAccess::impl(tok).cutBefore(doc, kChunkBytes) : doc.size();
    if (cut == std::string_view::npos) cut = doc.size();
    units.push_back({doc.substr(0, cut), !first, cut == doc.size()});
    doc.remove_prefix(cut);
  }
}

// Encodes every unit on kEncodeThreads threads (interleaved); ids[i] belongs to units[i].
// scratch[t] is thread t's state, kept across calls (tokenizer.json's cache of pre-tokens).
std::vector<std::vector<int>> encodeUnits(const Tokenizer& tok, const std::vector<Unit>& units,
                                          std::vector<HfTokenizer::ScratchPtr>& scratch) {
  const auto& impl = TokenizerAccess::impl(tok);  // auto: Impl is private to Tokenizer
  std::vector<std::vector<int>> ids(units.size());
  std::vector<std::exception_ptr> errors(kEncodeThreads);
  auto work = [&](int t) {
    try {
      for (size_t i = static_cast<size_t>(t); i < units.size(); i += kEncodeThreads)
        ids[i] = impl.encodeUnit(units[i].text, units[i].continuation, scratch[t].get(), tok.path());
    } catch (...) {
      errors[t] = std::current_exception();
    }
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < kEncodeThreads && static_cast<size_t>(t) < units.size(); ++t) helpers.emplace_back(work, t);
  work(0);
  for (auto& h : helpers) h.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  return ids;
}

}  // namespace

TokenizeResult tokenizeFiles(const TokenizeOptions& o) {
  LT_CHECK(!o.inputs.empty(), "tokenize needs at least one input text file");
  LT_CHECK(!o.outPath.empty(), "tokenize needs an output path");
  for (const auto& p : o.inputs) checkInputFile(p);
  const Tokenizer tok(o.tokenizerPath);
  const int eos = static_cast<int>(tok.eosId());
  LT_CHECK(eos >= 0, "tokenizer '", o.tokenizerPath, "' has no EOS token (eos_id = -1), and the token file needs "
           "one after every document; use a model trained with an EOS (longtrain's trainer gives eos_id 2)");
  TokenizeResult r;
  r.vocabSize = tok.vocabSize();
  r.eosId = eos;
  r.bytesPerToken = r.vocabSize <= 65536 ? 2 : 4;
  TokenFileWriter out(o.outPath, r.bytesPerToken);
  Progress progress(o.forceProgress || (o.progress && ::isatty(STDERR_FILENO)));
  std::vector<HfTokenizer::ScratchPtr> scratch;
  for (int t = 0; t < kEncodeThreads; ++t) scratch.push_back(TokenizerAccess::impl(tok).scratch());
  for (const auto& path : o.inputs) {
    const std::string text = readTextFile(path);
    if (tok.kind() == "tokenizer.json") checkUtf8(text, path);
    const int64_t readBefore = r.bytesRead;
    const std::vector<std::string_view> docs = splitDocuments(text, o.splitOn);
    for (size_t d = 0; d < docs.size();) {
      std::vector<Unit> units;
      for (size_t bytes = 0; d < docs.size() && bytes < kBatchBytes; bytes += docs[d++].size())
        appendUnits(docs[d], tok, units);
      std::vector<std::vector<int>> ids = encodeUnits(tok, units, scratch);
      for (size_t i = 0; i < units.size(); ++i) {
        if (units[i].endsDocument) {
          ids[i].push_back(eos);
          ++r.documents;
        }
        r.tokens += static_cast<int64_t>(ids[i].size());
        out.write(ids[i]);
      }
      r.bytesRead = readBefore + (docs[d - 1].data() + docs[d - 1].size() - text.data());
      progress.update(r);
    }
    r.bytesRead = readBefore + static_cast<int64_t>(text.size());
  }
  commitWithSidecar(out, o, tok, r);
  r.seconds = progress.seconds();
  progress.finish(r, o.outPath);
  return r;
}

}  // namespace lt::data
