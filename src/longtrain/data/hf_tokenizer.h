// A Hugging Face tokenizer.json with a byte-level BPE model (GPT-2, SmolLM2, Llama 3,
// Qwen2/Qwen3): added tokens matched first (leftmost-longest, on the raw text), the normalizer
// (NFC/NFD/NFKC/NFKD, through utf8proc), the pre-tokenizers (Split regexes through PCRE2 with
// Unicode properties, Digits, ByteLevel with GPT-2's regex), BPE merges by rank, and the
// ByteLevel decoder. Non-obvious: BPE runs on the raw bytes of each pre-token (ByteLevel's
// byte-to-character map is a bijection, so the vocabulary is re-keyed by bytes at load), and
// regexes are rewritten so that \s is Unicode's White_Space, as in Oniguruma (Hugging Face's
// engine), where PCRE2's \s lacks U+0085.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace lt::data {

// The offset of the first byte of `s` that does not begin a valid UTF-8 character, or npos.
size_t firstInvalidUtf8(std::string_view s);

class HfTokenizer {
 public:
  // Per-thread state of encode(): the cache of pre-tokens already encoded. Not shared.
  struct Scratch;
  struct ScratchDeleter {
    void operator()(Scratch* s) const;
  };
  using ScratchPtr = std::unique_ptr<Scratch, ScratchDeleter>;

  // `path` is a tokenizer.json; its tokenizer_config.json beside it (if any) names EOS and BOS.
  // lt::Error naming the file and the unsupported part (a WordPiece model, a Metaspace
  // pre-tokenizer, ...) where it is not a byte-level BPE tokenizer.
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer();
  HfTokenizer(const HfTokenizer&) = delete;
  HfTokenizer& operator=(const HfTokenizer&) = delete;

  int64_t vocabSize() const;  // the largest id + 1, added tokens included
  int64_t eosId() const;      // tokenizer_config.json's eos_token, else a known end token; -1: none
  int64_t bosId() const;      // tokenizer_config.json's bos_token; -1: none
  const std::string& eosToken() const;

  ScratchPtr newScratch() const;
  // Hugging Face's encode(text, add_special_tokens=False): added tokens written in the text
  // become their ids. `scratch` may be null (no cache kept between calls).
  std::vector<int> encode(std::string_view text, Scratch* scratch) const;
  // Hugging Face's decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False).
  std::string decode(const std::vector<int>& ids) const;
  // Where a document may be cut so that encoding the two parts gives the whole's ids: after a
  // newline between two printable ASCII characters, the last such at or before `limit`, else
  // the first after it; npos where there is none or the tokenizer's rules allow no cut (an
  // unknown Split regex, ByteLevel's add_prefix_space, an added token holding a newline).
  size_t cutBefore(std::string_view doc, size_t limit) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt::data
