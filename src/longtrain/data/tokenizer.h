// Text to token files: a tokenizer (a Hugging Face tokenizer.json with byte-level BPE, see
// hf_tokenizer.h, or a SentencePiece .model, which longtrain can also train) and
// `tokenizeFiles`, which writes the flat little-endian token file data.type uint16/uint32
// reads, EOS after every document, with its sidecar F.bin.json.
// Non-obvious: trained SentencePiece models keep text exactly (identity normalization, byte fallback), so
// decode(encode(text)) == text for any UTF-8, and a document is encoded in chunks cut after
// newlines, which gives the same ids as one call when no piece spans a newline (true of every
// model trainTokenizer writes, whose training lines hold none).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lt::data {

// A loaded tokenizer. Encoding and decoding are const and safe from several threads.
class Tokenizer {
 public:
  // A tokenizer.json, a SentencePiece .model, or a model directory holding one of them
  // (tokenizer.json first; its tokenizer.model where the tokenizer.json is not byte-level BPE).
  // lt::Error naming the path if unreadable/invalid.
  explicit Tokenizer(const std::string& path);
  // The file a path names: itself, or the tokenizer file of a directory.
  static std::string resolve(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  int64_t vocabSize() const;
  int64_t eosId() const;  // -1 if the model has none
  int64_t bosId() const;  // -1 if none
  std::string tokenText(int64_t id) const;  // a token as its vocabulary writes it ("</s>"); "" for -1
  std::vector<int64_t> encode(const std::string& text) const;  // no BOS/EOS added
  std::string decode(const std::vector<int64_t>& ids) const;
  const std::string& path() const;  // the file loaded
  std::string kind() const;          // "tokenizer.json" or "sentencepiece"

 private:
  struct Impl;
  friend struct TokenizerAccess;  // tokenizeFiles' chunked, parallel encoding
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// Trains a SentencePiece model (unigram by default; BPE optional) on the given text files and
// writes <outPrefix>.model and <outPrefix>.vocab; documents are split like TokenizeOptions says.
// Deterministic for the same input. Ids: unk 0, bos 1, eos 2, no pad (Llama's). The vocabulary
// may come out smaller than vocabSize on a small corpus; it must hold the 256 byte pieces, the
// 3 specials and the corpus's characters (an lt::Error gives the minimum otherwise).
// modelType: "unigram" or "bpe".
void trainTokenizer(const std::vector<std::string>& inputs, int64_t vocabSize, const std::string& outPrefix,
                    const std::string& splitOn = "", const std::string& modelType = "unigram");

struct TokenizeOptions {
  std::string tokenizerPath, outPath;
  std::vector<std::string> inputs;
  // "": each input file is one document; else the separator between documents ("%\n" for
  // fortune files, "\n\n" for paragraphs). Empty and whitespace-only documents are skipped.
  std::string splitOn;
  bool progress = true;        // a live progress line on stderr when stderr is a terminal
  bool forceProgress = false;  // ... even when it is not (logs, tests)
};
struct TokenizeResult {
  int64_t documents = 0, tokens = 0;  // tokens include one EOS per document
  int bytesPerToken = 2;              // 2: uint16 (vocabulary <= 65536), 4: uint32
  double seconds = 0;
  int64_t bytesRead = 0;  // text read from the inputs
  int64_t vocabSize = 0, eosId = -1;
};
// Writes o.outPath atomically (via <outPath>.tmp): the documents' ids, EOS after each, as
// uint16 or uint32 little-endian, no header (llm.c/nanoGPT's .bin without one), and beside it
// the sidecar <outPath>.json (config/token_sidecar.h). Streams: one input file is held at a
// time. A summary line goes to stderr.
TokenizeResult tokenizeFiles(const TokenizeOptions& o);

// The documents of one file's text: the whole text, or the records between `splitOn`s;
// empty and whitespace-only ones are dropped. Views into `text`.
std::vector<std::string_view> splitDocuments(std::string_view text, const std::string& splitOn);

}  // namespace lt::data
