// tokenizer.json's byte-level BPE (hf_tokenizer.h says what is supported). The stages follow
// Hugging Face's order: added tokens on the raw text, the normalizer on what lies between them,
// added tokens marked "normalized" on that, the pre-tokenizers, then BPE per pre-token with a
// per-thread cache. Non-obvious: merges run on a heap ordered by (rank, position), which is
// the order Hugging Face merges in; the simpler "merge every occurrence of the best pair"
// loop agrees only while a merged pair never outranks the one that formed it.
#include "longtrain/data/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <functional>
#include <queue>
#include <unordered_map>

#include "longtrain/config/json_text.h"
#include "longtrain/core/check.h"

namespace lt::data {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr size_t kCacheEntries = size_t{1} << 20;  // a scratch's cache is cleared beyond this
constexpr size_t kMaxCachedBytes = 256;             // longer pre-tokens are not cached

// GPT-2's pre-tokenizer regex, ByteLevel's when use_regex is true.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Split regexes under which a cut after "X\nY" (X, Y printable ASCII) leaves every pre-token
// whole: Qwen2/Qwen3's and Llama 3's (each alternative ends at or before such a newline, none
// looks behind, none reaches past it), and GPT-2's.
const char* const kCuttablePatterns[] = {
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
    kGpt2Pattern,
};

// ------------------------------------------------------------------ byte-level character map

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 upwards in byte order.
std::array<char32_t, 256> byteToChar() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

// Decodes one UTF-8 character at s[i] (valid input), advancing i.
char32_t nextChar(std::string_view s, size_t& i) {
  utf8proc_int32_t c = 0;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &c);
  i += n > 0 ? static_cast<size_t>(n) : 1;
  return n > 0 ? static_cast<char32_t>(c) : 0xFFFD;
}


bool isWordChar(char32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool isNumeric(char32_t c) {  // Rust's char::is_numeric, which the Digits pre-tokenizer uses
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

bool isUnicodeSpace(char32_t c) {  // Unicode's White_Space
  return (c >= 9 && c <= 13) || c == ' ' || c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) ||
         c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Rewrites \s and \S to Unicode's White_Space, which adds U+0085 to PCRE2's \s (Oniguruma's, and
// so Hugging Face's, \s is White_Space). Inside a class \s gains \x{85}; \S there is left alone.
std::string oniguruma_whitespace(const std::string& p) {
  std::string out;
  bool inClass = false, quoted = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (quoted) {
      out += c;
      if (c == '\\' && i + 1 < p.size() && p[i + 1] == 'E') out += p[++i], quoted = false;
      continue;
    }
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') out += inClass ? R"(\s\x{85})" : R"([\s\x{85}])";
      else if (e == 'S' && !inClass) out += R"([^\s\x{85}])";
      else if (e == 'Q') out += "\\Q", quoted = true;
      else out += c, out += e;
      continue;
    }
    if (!inClass && c == '[') {
      inClass = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ] is literal
      continue;
    }
    if (inClass && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:] inside a class
      const size_t end = p.find(":]", i + 2);
      const size_t stop = end == std::string::npos ? p.size() : end + 2;
      out.append(p, i, stop - i);
      i = stop - 1;
      continue;
    }
    if (inClass && c == ']') inClass = false;
    out += c;
  }
  return out;
}

// A compiled PCRE2 pattern (JIT where available).
class Regex {
 public:
  Regex(const std::string& pattern, bool literal, const std::string& where) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    const std::string p = literal ? pattern : oniguruma_whitespace(pattern);
    const uint32_t flags = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.data()), p.size(), flags, &err, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      LT_CHECK(false, where, ": the regex ", json(pattern).dump(), " does not compile (", reinterpret_cast<char*>(msg),
               " at offset ", offset, ")");
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
    pattern_ = pattern;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  const std::string& pattern() const { return pattern_; }
  pcre2_match_data* newMatchData() const { return pcre2_match_data_create_from_pattern(code_, nullptr); }

  // Calls f(begin, end) for every non-empty match in s, left to right, non-overlapping.
  template <class F>
  void forEachMatch(std::string_view s, pcre2_match_data* md, const F& f) const {
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    for (size_t at = 0; at <= s.size();) {
      const int rc = jit_ ? pcre2_jit_match(code_, subject, s.size(), at, 0, md, nullptr)
                          : pcre2_match(code_, subject, s.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) return;
      LT_ASSERT(rc >= 0, "PCRE2 match failed with code ", rc);
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] > ov[0]) {
        f(ov[0], ov[1]);
        at = ov[1];
      } else {  // an empty match: step over one character
        at = ov[0] + 1;
        while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
      }
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
  std::string pattern_;
};

// ------------------------------------------------------------------ pieces and splitting

// A piece of text being pre-tokenized: a range of the working buffer.
struct Piece {
  uint32_t begin, end;
};

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parseBehavior(const std::string& b, const std::string& where) {
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "Removed") return Behavior::Removed;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  LT_CHECK(false, where, ": Split behavior \"", b, "\" is not known (Isolated, Removed, MergedWithPrevious, ",
           "MergedWithNext, Contiguous)");
  return Behavior::Isolated;
}

// Hugging Face's SplitDelimiterBehavior over one piece's segments (matches and the gaps
// between them), appending the resulting pieces to `out`.
struct Segment {
  uint32_t begin, end;
  bool match;
};
void applyBehavior(const std::vector<Segment>& segs, Behavior b, std::vector<Piece>& out) {
  bool pendingMerge = false;  // MergedWithNext: the last piece waits for the next segment
  for (size_t i = 0; i < segs.size(); ++i) {
    const Segment& s = segs[i];
    switch (b) {
      case Behavior::Isolated: out.push_back({s.begin, s.end}); break;
      case Behavior::Removed:
        if (!s.match) out.push_back({s.begin, s.end});
        break;
      case Behavior::MergedWithPrevious:
        if (s.match && !out.empty() && i > 0) out.back().end = s.end;
        else out.push_back({s.begin, s.end});
        break;
      case Behavior::MergedWithNext:
        if (pendingMerge) out.back().end = s.end;
        else out.push_back({s.begin, s.end});
        pendingMerge = s.match;
        break;
      case Behavior::Contiguous:
        if (s.match && i > 0 && segs[i - 1].match) out.back().end = s.end;
        else out.push_back({s.begin, s.end});
        break;
    }
  }
}

// ------------------------------------------------------------------ pre-tokenizers

struct PreTokenizer {
  enum Kind { Split, Digits, ByteLevel } kind;
  std::unique_ptr<Regex> regex;  // Split, and ByteLevel with use_regex
  Behavior behavior = Behavior::Isolated;
  bool invert = false, individualDigits = false, addPrefixSpace = false;
};

// A trie of added tokens over bytes: leftmost-longest matching, as Hugging Face's.
class TokenTrie {
 public:
  void add(const std::string& s, int token) {
    int node = 0;
    for (unsigned char c : s) {
      const uint64_t key = (static_cast<uint64_t>(node) << 8) | c;
      auto it = edges_.find(key);
      if (it == edges_.end()) it = edges_.emplace(key, newNode()).first;
      node = it->second;
    }
    terminal_[node] = token;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  bool empty() const { return edges_.empty(); }
  // The longest token starting at text[i]: {token, length}, or {-1, 0}.
  std::pair<int, size_t> longestAt(std::string_view text, size_t i) const {
    if (!first_[static_cast<unsigned char>(text[i])]) return {-1, 0};
    std::pair<int, size_t> best{-1, 0};
    for (size_t j = i, node = 0; j < text.size(); ++j) {
      const auto it = edges_.find((static_cast<uint64_t>(node) << 8) | static_cast<unsigned char>(text[j]));
      if (it == edges_.end()) break;
      node = static_cast<size_t>(it->second);
      if (terminal_[node] >= 0) best = {terminal_[node], j + 1 - i};
    }
    return best;
  }

 private:
  int newNode() {
    terminal_.push_back(-1);
    return static_cast<int>(terminal_.size() - 1);
  }
  std::unordered_map<uint64_t, int> edges_;
  std::vector<int> terminal_ = {-1};
  std::array<bool, 256> first_{};
};

struct AddedToken {
  std::string content;
  int id = 0;
  bool special = false, normalized = false, lstrip = false, rstrip = false, singleWord = false;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using BytesMap = std::unordered_map<std::string, int, StringHash, std::equal_to<>>;


// The content of tokenizer_config.json's eos_token / bos_token: a string or {"content": ...}.
std::string configToken(const json& cfg, const char* key) {
  const auto it = cfg.find(key);
  if (it == cfg.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"].get<std::string>();
  return "";
}

}  // namespace

// ------------------------------------------------------------------ scratch

struct HfTokenizer::Scratch {
  std::unordered_map<std::string, std::vector<int>, StringHash, std::equal_to<>> cache;
  std::vector<pcre2_match_data*> matchData;  // one per regex, in Impl::regexes order
  std::string normalized, buffer;
  std::vector<Piece> pieces, next;
  std::vector<Segment> segments;
  // BPE's symbols and heap, reused.
  std::vector<int> ids, prev, nextSym;
  ~Scratch() {
    for (auto* md : matchData) pcre2_match_data_free(md);
  }
};

void HfTokenizer::ScratchDeleter::operator()(Scratch* s) const { delete s; }

// ------------------------------------------------------------------ Impl

struct HfTokenizer::Impl {
  std::string path;
  enum class Form { None, NFC, NFD, NFKC, NFKD };
  std::vector<Form> normalizers;
  std::vector<PreTokenizer> preTokenizers;
  std::vector<const Regex*> regexes;  // every compiled regex, for the scratch's match data
  std::vector<AddedToken> added;
  TokenTrie rawTrie, normalizedTrie;
  BytesMap byBytes;                    // a model token's bytes -> id
  std::vector<std::string> idToBytes;  // id -> bytes (added tokens: their content)
  std::array<int, 256> byteId{};
  std::unordered_map<uint64_t, std::pair<int, int>> merges;  // (left, right) -> (rank, merged)
  bool ignoreMerges = false, cuttable = true;
  int64_t vocab = 0, eos = -1, bos = -1;
  std::string eosToken;

  void load(const std::string& file);
  void loadNormalizer(const json& n);
  void loadPreTokenizer(const json& p);
  void loadModel(const json& m);
  void loadAddedTokens(const json& a);
  void loadSpecialIds(const fs::path& dir);

  std::string where(const std::string& part) const { return "tokenizer '" + path + "' (" + part + ")"; }
  void normalize(std::string_view in, std::string& out) const;
  void preTokenize(Scratch& s) const;
  void bpe(std::string_view word, Scratch& s, std::vector<int>& out) const;
  void encodeWord(std::string_view word, Scratch& s, std::vector<int>& out) const;
  void encodeNormalized(std::string_view text, Scratch& s, std::vector<int>& out) const;
  void encodePlain(std::string_view text, Scratch& s, std::vector<int>& out) const;
};

void HfTokenizer::Impl::load(const std::string& file) {
  path = file;
  const std::string what = "tokenizer '" + file + "'";
  const json j = config::parseJsonText(config::readJsonFile(file, what), what);  // line and column of an error
  LT_CHECK(j.is_object(), what, " is not a JSON object (a tokenizer.json from a Hugging Face model directory is ",
           "expected)");
  LT_CHECK(j.contains("model") && j["model"].is_object(), where("model"), ": no \"model\" object; is this a ",
           "tokenizer.json?");
  loadModel(j["model"]);
  loadNormalizer(j.value("normalizer", json()));
  loadPreTokenizer(j.value("pre_tokenizer", json()));
  LT_CHECK(!preTokenizers.empty() && preTokenizers.back().kind == PreTokenizer::ByteLevel, where("pre_tokenizer"),
           ": longtrain reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/3, SmolLM2), whose last ",
           "pre-tokenizer is ByteLevel; this one is not (for a SentencePiece-style tokenizer.json, as Llama 2 ",
           "and Mistral ship, give their tokenizer.model instead)");
  const json dec = j.value("decoder", json());
  LT_CHECK(dec.is_object() && dec.value("type", "") == "ByteLevel", where("decoder"),
           ": the decoder must be ByteLevel for a byte-level BPE tokenizer, got ", dec.dump().substr(0, 200));
  loadAddedTokens(j.value("added_tokens", json::array()));
  for (const auto& p : preTokenizers)
    if (p.regex) regexes.push_back(p.regex.get());
  loadSpecialIds(fs::path(file).parent_path());
}

void HfTokenizer::Impl::loadNormalizer(const json& n) {
  if (n.is_null()) return;
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& x : n.value("normalizers", json::array())) loadNormalizer(x);
    return;
  }
  static const std::pair<const char*, Form> forms[] = {
      {"NFC", Form::NFC}, {"NFD", Form::NFD}, {"NFKC", Form::NFKC}, {"NFKD", Form::NFKD}};
  for (const auto& [name, form] : forms)
    if (type == name) {
      normalizers.push_back(form);
      return;
    }
  LT_CHECK(false, where("normalizer"), ": normalizer \"", type, "\" is not supported (NFC, NFD, NFKC, NFKD and ",
           "Sequence are)");
}

void HfTokenizer::Impl::loadPreTokenizer(const json& p) {
  if (p.is_null()) return;
  const std::string type = p.value("type", "");
  PreTokenizer t;
  if (type == "Sequence") {
    for (const auto& x : p.value("pretokenizers", json::array())) loadPreTokenizer(x);
    return;
  } else if (type == "Split") {
    t.kind = PreTokenizer::Split;
    const json pat = p.value("pattern", json());
    const bool isRegex = pat.contains("Regex");
    LT_CHECK(isRegex || pat.contains("String"), where("pre_tokenizer"), ": Split needs a pattern {\"Regex\": ...} ",
             "or {\"String\": ...}");
    const std::string text = pat[isRegex ? "Regex" : "String"].get<std::string>();
    t.regex = std::make_unique<Regex>(text, !isRegex, where("pre_tokenizer Split"));
    t.behavior = parseBehavior(p.value("behavior", "Isolated"), where("pre_tokenizer"));
    t.invert = p.value("invert", false);
    const bool known = isRegex && !t.invert && t.behavior == Behavior::Isolated &&
                       std::any_of(std::begin(kCuttablePatterns), std::end(kCuttablePatterns),
                                   [&](const char* k) { return text == k; });
    cuttable = cuttable && known;
  } else if (type == "Digits") {
    t.kind = PreTokenizer::Digits;
    t.individualDigits = p.value("individual_digits", false);
  } else if (type == "ByteLevel") {
    t.kind = PreTokenizer::ByteLevel;
    t.addPrefixSpace = p.value("add_prefix_space", true);
    if (p.value("use_regex", true)) t.regex = std::make_unique<Regex>(kGpt2Pattern, false, where("ByteLevel"));
    cuttable = cuttable && !t.addPrefixSpace;
  } else {
    LT_CHECK(false, where("pre_tokenizer"), ": pre-tokenizer \"", type, "\" is not supported (Split, Digits, ",
             "ByteLevel and Sequence are: the byte-level BPE family); for a SentencePiece-style tokenizer.json ",
             "(Metaspace, as Llama 2 and Mistral ship) give the model's tokenizer.model instead");
  }
  LT_CHECK(preTokenizers.empty() || preTokenizers.back().kind != PreTokenizer::ByteLevel, where("pre_tokenizer"),
           ": ByteLevel must be the last pre-tokenizer, but \"", type, "\" follows it");
  preTokenizers.push_back(std::move(t));
}

void HfTokenizer::Impl::loadModel(const json& m) {
  const std::string type = m.value("type", "");
  LT_CHECK(type == "BPE", where("model"), ": model type \"", type, "\" is not supported; longtrain reads BPE ",
           "tokenizer.json files (give a SentencePiece tokenizer.model for Unigram models)");
  LT_CHECK(m.contains("vocab") && m["vocab"].is_object() && m.contains("merges") && m["merges"].is_array(),
           where("model"), ": a BPE model needs \"vocab\" (an object) and \"merges\" (a list)");
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json a = m.value(affix, json());
    LT_CHECK(a.is_null() || (a.is_string() && a.get<std::string>().empty()), where("model"), ": ", affix, " ",
             a.dump(), " is not supported (byte-level BPE has none)");
  }
  ignoreMerges = m.value("ignore_merges", false);
  const auto charToByte = [] {
    std::unordered_map<char32_t, int> r;
    const auto map = byteToChar();
    for (int b = 0; b < 256; ++b) r[map[b]] = b;
    return r;
  }();
  std::unordered_map<std::string, int> byText;
  for (const auto& [token, idj] : m["vocab"].items()) {
    const int id = idj.get<int>();
    LT_CHECK(id >= 0, where("model.vocab"), ": token ", json(token).dump(), " has a negative id");
    byText.emplace(token, id);
    std::string bytes;
    bool byteLevel = true;
    for (size_t i = 0; i < token.size() && byteLevel;) {
      const auto it = charToByte.find(nextChar(token, i));
      if (it == charToByte.end()) byteLevel = false;
      else bytes += static_cast<char>(it->second);
    }
    if (static_cast<size_t>(id) >= idToBytes.size()) idToBytes.resize(static_cast<size_t>(id) + 1);
    idToBytes[static_cast<size_t>(id)] = byteLevel ? bytes : token;
    if (byteLevel) byBytes.emplace(bytes, id);
    vocab = std::max<int64_t>(vocab, id + 1);
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = byBytes.find(std::string(1, static_cast<char>(b)));
    LT_CHECK(it != byBytes.end(), where("model.vocab"), ": byte 0x", std::hex, b, std::dec,
             " has no token, so this is not a byte-level vocabulary");
    byteId[b] = it->second;
  }
  const json& list = m["merges"];
  merges.reserve(list.size());
  for (size_t r = 0; r < list.size(); ++r) {
    std::string a, b;
    if (list[r].is_string()) {
      const std::string s = list[r].get<std::string>();
      const size_t sp = s.find(' ', 1);
      LT_CHECK(sp != std::string::npos, where("model.merges"), ": merge ", r, " \"", s, "\" is not \"a b\"");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else {
      LT_CHECK(list[r].is_array() && list[r].size() == 2, where("model.merges"), ": merge ", r, " is not a pair");
      a = list[r][0].get<std::string>(), b = list[r][1].get<std::string>();
    }
    const auto ia = byText.find(a), ib = byText.find(b), im = byText.find(a + b);
    LT_CHECK(ia != byText.end() && ib != byText.end() && im != byText.end(), where("model.merges"), ": merge ", r,
             " (", json(a).dump(), ", ", json(b).dump(), ") names a token the vocabulary lacks");
    const uint64_t key = (static_cast<uint64_t>(ia->second) << 32) | static_cast<uint32_t>(ib->second);
    merges.emplace(key, std::make_pair(static_cast<int>(r), im->second));  // the first rank of a pair wins
  }
}

void HfTokenizer::Impl::loadAddedTokens(const json& a) {
  for (const auto& t : a) {
    AddedToken x;
    x.content = t.value("content", "");
    x.id = t.value("id", -1);
    LT_CHECK(!x.content.empty() && x.id >= 0, where("added_tokens"), ": an entry lacks content or id: ", t.dump());
    x.special = t.value("special", false);
    x.normalized = t.value("normalized", !x.special);
    x.lstrip = t.value("lstrip", false), x.rstrip = t.value("rstrip", false);
    x.singleWord = t.value("single_word", false);
    if (static_cast<size_t>(x.id) >= idToBytes.size()) idToBytes.resize(static_cast<size_t>(x.id) + 1);
    idToBytes[static_cast<size_t>(x.id)] = x.content;
    vocab = std::max<int64_t>(vocab, x.id + 1);
    if (x.content.find('\n') != std::string::npos || x.lstrip) cuttable = false;  // see cutBefore
    const int index = static_cast<int>(added.size());
    if (x.normalized && !normalizers.empty()) {
      std::string n;
      normalize(x.content, n);
      normalizedTrie.add(n, index);
    } else {
      rawTrie.add(x.content, index);
    }
    added.push_back(std::move(x));
  }
}

void HfTokenizer::Impl::loadSpecialIds(const fs::path& dir) {
  std::string eosName, bosName;
  std::error_code ec;
  if (const fs::path cfgPath = dir / "tokenizer_config.json"; fs::is_regular_file(cfgPath, ec)) {
    const json cfg = config::readJson(cfgPath.string(), "'" + cfgPath.string() + "'");
    if (cfg.is_object()) eosName = configToken(cfg, "eos_token"), bosName = configToken(cfg, "bos_token");
  }
  const auto idOf = [&](const std::string& content) -> int64_t {
    for (const auto& t : added)
      if (t.content == content) return t.id;
    const auto it = byBytes.find(content);  // end tokens are printable ASCII: their bytes are their text
    return it == byBytes.end() ? -1 : it->second;
  };
  if (eosName.empty())  // no tokenizer_config.json: the end-of-text tokens the families use
    for (const char* k : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<|im_end|>"})
      if (idOf(k) >= 0) {
        eosName = k;
        break;
      }
  if (!eosName.empty()) eos = idOf(eosName), eosToken = eosName;
  if (!bosName.empty()) bos = idOf(bosName);
}

// ------------------------------------------------------------------ encoding

namespace {

}  // namespace

size_t firstInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    if (i + 8 <= n) {  // eight ASCII bytes at once
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      if ((w & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

namespace {

bool isAscii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

// The text between the last non-space character and the end, and between the start and the
// first non-space character: what lstrip and rstrip take.
size_t trailingSpaceStart(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!isUnicodeSpace(nextChar(s, i))) break;
    end = start;
  }
  return end;
}
size_t leadingSpaceEnd(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    if (!isUnicodeSpace(nextChar(s, j))) break;
    i = j;
  }
  return i;
}

char32_t charBefore(std::string_view s, size_t i) {
  if (i == 0) return 0;
  size_t start = i - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return nextChar(s, start);
}

// Splits `text` at the added tokens `trie` finds (leftmost-longest, with lstrip, rstrip and
// single_word), calling plain(view) for the text between them and token(id) for each.
template <class Plain, class Token>
void splitAdded(std::string_view text, const TokenTrie& trie, const std::vector<AddedToken>& added,
                const Plain& plain, const Token& token) {
  if (trie.empty()) {
    if (!text.empty()) plain(text);
    return;
  }
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    const auto [index, len] = trie.longestAt(text, i);
    if (index < 0) {
      ++i;
      continue;
    }
    const AddedToken& t = added[static_cast<size_t>(index)];
    if (t.singleWord) {
      size_t after = i + len;
      const bool inWord = isWordChar(charBefore(text, i)) || (after < text.size() && isWordChar(nextChar(text, after)));
      if (inWord) {
        ++i;
        continue;
      }
    }
    std::string_view before = text.substr(start, i - start);
    if (t.lstrip) before = before.substr(0, trailingSpaceStart(before));
    if (!before.empty()) plain(before);
    token(t.id);
    i += len;
    if (t.rstrip) i += leadingSpaceEnd(text.substr(i));
    start = i;
  }
  if (start < text.size()) plain(text.substr(start));
}

}  // namespace

void HfTokenizer::Impl::normalize(std::string_view in, std::string& out) const {
  out.assign(in);
  if (normalizers.empty() || isAscii(in)) return;  // every form leaves ASCII as it is
  for (Form f : normalizers) {
    int flags = UTF8PROC_STABLE;
    if (f == Form::NFC || f == Form::NFKC) flags |= UTF8PROC_COMPOSE;
    else flags |= UTF8PROC_DECOMPOSE;
    if (f == Form::NFKC || f == Form::NFKD) flags |= UTF8PROC_COMPAT;
    utf8proc_uint8_t* result = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(out.data()),
                                static_cast<utf8proc_ssize_t>(out.size()), &result,
                                static_cast<utf8proc_option_t>(flags));
    LT_CHECK(n >= 0, "tokenizer '", path, "': normalizing ", out.size(), " bytes failed: ", utf8proc_errmsg(n));
    out.assign(reinterpret_cast<const char*>(result), static_cast<size_t>(n));
    std::free(result);
  }
}

void HfTokenizer::Impl::preTokenize(Scratch& s) const {
  size_t regexIndex = 0;
  for (const PreTokenizer& p : preTokenizers) {
    s.next.clear();
    pcre2_match_data* md = p.regex ? s.matchData[regexIndex++] : nullptr;
    for (const Piece piece : s.pieces) {
      s.segments.clear();
      std::string_view text = std::string_view(s.buffer).substr(piece.begin, piece.end - piece.begin);
      uint32_t base = piece.begin;
      if (p.kind == PreTokenizer::ByteLevel && p.addPrefixSpace && (text.empty() || text[0] != ' ')) {
        const std::string copy = " " + std::string(text);
        base = static_cast<uint32_t>(s.buffer.size());
        s.buffer += copy;
        text = std::string_view(s.buffer).substr(base, copy.size());
      }
      if (p.kind == PreTokenizer::Digits) {
        for (size_t i = 0; i < text.size();) {  // a digit each, a run of non-digits as one gap
          size_t j = i;
          const bool numeric = isNumeric(nextChar(text, j));
          if (!numeric && !s.segments.empty() && !s.segments.back().match)
            s.segments.back().end = static_cast<uint32_t>(base + j);
          else
            s.segments.push_back({static_cast<uint32_t>(base + i), static_cast<uint32_t>(base + j), numeric});
          i = j;
        }
        applyBehavior(s.segments, p.individualDigits ? Behavior::Isolated : Behavior::Contiguous, s.next);
        continue;
      }
      if (!p.regex) {  // ByteLevel without its regex: the piece as it is
        s.next.push_back({base, static_cast<uint32_t>(base + text.size())});
        continue;
      }
      size_t last = 0;
      p.regex->forEachMatch(text, md, [&](size_t b, size_t e) {
        if (b > last) s.segments.push_back({static_cast<uint32_t>(base + last), static_cast<uint32_t>(base + b), p.invert});
        s.segments.push_back({static_cast<uint32_t>(base + b), static_cast<uint32_t>(base + e), !p.invert});
        last = e;
      });
      if (last < text.size())
        s.segments.push_back({static_cast<uint32_t>(base + last), static_cast<uint32_t>(base + text.size()), p.invert});
      applyBehavior(s.segments, p.kind == PreTokenizer::ByteLevel ? Behavior::Isolated : p.behavior, s.next);
    }
    std::swap(s.pieces, s.next);
  }
}

// BPE over the bytes of one pre-token: the pair of lowest (rank, position) merges first.
void HfTokenizer::Impl::bpe(std::string_view word, Scratch& s, std::vector<int>& out) const {
  const int n = static_cast<int>(word.size());
  auto& ids = s.ids;
  auto& prev = s.prev;
  auto& next = s.nextSym;
  ids.resize(static_cast<size_t>(n)), prev.resize(static_cast<size_t>(n)), next.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    ids[i] = byteId[static_cast<unsigned char>(word[static_cast<size_t>(i)])];
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int rank, pos, left, right, rightPos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::vector<Candidate> heap;
  const auto consider = [&](int pos) {
    const int r = next[pos];
    if (pos < 0 || r < 0) return;
    const auto it = merges.find((static_cast<uint64_t>(ids[pos]) << 32) | static_cast<uint32_t>(ids[r]));
    if (it == merges.end()) return;
    heap.push_back({it->second.first, pos, ids[pos], ids[r], r, it->second.second});
    std::push_heap(heap.begin(), heap.end(), std::greater<>());
  };
  for (int i = 0; i + 1 < n; ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), std::greater<>());
    const Candidate c = heap.back();
    heap.pop_back();
    if (ids[c.pos] != c.left || next[c.pos] != c.rightPos || ids[c.rightPos] != c.right) continue;  // stale
    ids[c.pos] = c.merged;
    ids[c.rightPos] = -1;
    next[c.pos] = next[c.rightPos];
    if (next[c.pos] >= 0) prev[next[c.pos]] = c.pos;
    if (prev[c.pos] >= 0) consider(prev[c.pos]);
    consider(c.pos);
  }
  for (int i = 0; i >= 0; i = next[i]) out.push_back(ids[i]);
}

void HfTokenizer::Impl::encodeWord(std::string_view word, Scratch& s, std::vector<int>& out) const {
  if (word.empty()) return;
  if (ignoreMerges || word.size() == 1) {
    if (const auto it = byBytes.find(word); it != byBytes.end()) {
      out.push_back(it->second);
      return;
    }
  }
  const bool cacheable = word.size() <= kMaxCachedBytes;
  if (cacheable)
    if (const auto it = s.cache.find(word); it != s.cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  const size_t before = out.size();
  bpe(word, s, out);
  if (!cacheable) return;
  if (s.cache.size() >= kCacheEntries) s.cache.clear();
  s.cache.emplace(std::string(word), std::vector<int>(out.begin() + static_cast<std::ptrdiff_t>(before), out.end()));
}

void HfTokenizer::Impl::encodePlain(std::string_view text, Scratch& s, std::vector<int>& out) const {
  s.buffer.assign(text);
  s.pieces.assign(1, Piece{0, static_cast<uint32_t>(text.size())});
  preTokenize(s);
  for (const Piece p : s.pieces) encodeWord(std::string_view(s.buffer).substr(p.begin, p.end - p.begin), s, out);
}

void HfTokenizer::Impl::encodeNormalized(std::string_view text, Scratch& s, std::vector<int>& out) const {
  normalize(text, s.normalized);  // encodePlain leaves s.normalized alone, so the view stays valid
  splitAdded(
      s.normalized, normalizedTrie, added, [&](std::string_view plain) { encodePlain(plain, s, out); },
      [&](int id) { out.push_back(id); });
}

// ------------------------------------------------------------------ HfTokenizer

HfTokenizer::HfTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  LT_CHECK(fs::is_regular_file(path, ec), "tokenizer '", path, "' does not exist or is not a file (give a ",
           "tokenizer.json, or the model directory that holds one)");
  impl_->load(path);
}
HfTokenizer::~HfTokenizer() = default;

int64_t HfTokenizer::vocabSize() const { return impl_->vocab; }
int64_t HfTokenizer::eosId() const { return impl_->eos; }
int64_t HfTokenizer::bosId() const { return impl_->bos; }
const std::string& HfTokenizer::eosToken() const { return impl_->eosToken; }

HfTokenizer::ScratchPtr HfTokenizer::newScratch() const {
  ScratchPtr s(new Scratch);
  for (const Regex* r : impl_->regexes) s->matchData.push_back(r->newMatchData());
  return s;
}

std::vector<int> HfTokenizer::encode(std::string_view text, Scratch* scratch) const {
  const size_t bad = firstInvalidUtf8(text);
  LT_CHECK(bad == std::string_view::npos, "text is not valid UTF-8 at byte ", bad, " (of ", text.size(),
           "); tokenizer '", impl_->path, "' takes UTF-8 text (convert it first, e.g. with iconv)");
  ScratchPtr own;
  if (!scratch) own = newScratch(), scratch = own.get();
  std::vector<int> out;
  out.reserve(text.size() / 3 + 4);
  splitAdded(
      text, impl_->rawTrie, impl_->added, [&](std::string_view plain) { impl_->encodeNormalized(plain, *scratch, out); },
      [&](int id) { out.push_back(id); });
  return out;
}

std::string HfTokenizer::decode(const std::vector<int>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    LT_CHECK(id >= 0 && static_cast<size_t>(id) < impl_->idToBytes.size() && !impl_->idToBytes[id].empty(), "token id ",
             id, " at position ", i, " is not in tokenizer '", impl_->path, "' (vocabulary ", impl_->vocab, ")");
    out += impl_->idToBytes[static_cast<size_t>(id)];
  }
  return out;
}

size_t HfTokenizer::cutBefore(std::string_view doc, size_t limit) const {
  if (!impl_->cuttable) return std::string_view::npos;
  const auto printable = [](char c) { return c > ' ' && c < 0x7F; };
  const auto cutAt = [&](size_t i) { return doc[i] == '\n' && printable(doc[i - 1]) && printable(doc[i + 1]); };
  if (doc.size() < 3 || limit < 2) return std::string_view::npos;
  for (size_t i = std::min(limit, doc.size() - 1) - 1; i >= 1; --i)
    if (cutAt(i)) return i + 1;
  for (size_t i = std::max<size_t>(limit, 1); i + 1 < doc.size(); ++i)
    if (cutAt(i)) return i + 1;
  return std::string_view::npos;
}

}  // namespace lt::data
