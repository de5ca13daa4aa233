// data/tokenizer: SentencePiece training on a generated corpus, exact round trips (byte
// fallback for unseen characters), the token file (one EOS per document, uint16), errors, and
// `longtrain tokenize` end to end. Non-obvious: one model is trained for the whole suite
// (SetUpTestSuite), and the vocabulary is 400, not 200: byte fallback alone takes 259 pieces.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "longtrain/core/check.h"
#include "longtrain/data/tokenizer.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using lt::data::Tokenizer;

constexpr int64_t kVocab = 400;
const std::string kBin = LONGTRAIN_BIN;

// Deterministic English-like text: `count` documents of 1-4 sentences, some lines broken.
std::vector<std::string> makeDocuments(int count, uint64_t seed) {
  static const std::vector<std::string> words = {
      "the",   "a",     "small", "river", "runs",   "over",  "stones", "while", "old",    "trees",  "watch",
      "quiet", "birds", "sing",  "of",    "winter", "and",   "summer", "light", "falls",  "on",     "green",
      "hills", "where", "we",    "walk",  "slowly", "every", "day",    "café",  "naïve",  "über",   "reads",
      "books", "in",    "2024",  "with",  "42",     "cats",  "dog's",  "house", "is",     "near",   "sea"};
  uint64_t s = seed;
  auto next = [&](uint64_t n) {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (s >> 33) % n;
  };
  std::vector<std::string> docs;
  for (int d = 0; d < count; ++d) {
    std::string doc;
    const uint64_t sentences = 1 + next(4);
    for (uint64_t k = 0; k < sentences; ++k) {
      std::string sentence;
      const uint64_t n = 4 + next(9);
      for (uint64_t w = 0; w < n; ++w) sentence += (w ? " " : "") + words[next(words.size())];
      sentence[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(sentence[0])));
      doc += sentence + (next(5) == 0 ? "!" : ".") + (next(3) == 0 ? "\n" : " ");
    }
    doc.back() = '\n';
    docs.push_back(doc);
  }
  return docs;
}

// The documents as a fortune file: each followed by "%\n".
fs::path writeFortunes(const fs::path& p, const std::vector<std::string>& docs) {
  std::ofstream f(p, std::ios::binary);
  for (const auto& d : docs) f << d << "%\n";
  return p;
}

std::vector<uint16_t> readUint16(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<uint16_t> v(fs::file_size(p) / 2);
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * 2));
  return v;
}

class Tokenize : public ::testing::Test {
 protected:
  // CTest runs every test in its own process, two at a time: each process gets its own
  // directory (a shared one was emptied by one process's set-up under the other's feet).
  static void SetUpTestSuite() {
    dir_ = lt::testing::freshTempDir("longtrain_tokenizer_test_" + std::to_string(::getpid()));
    docs_ = makeDocuments(300, 7);
    corpus_ = writeFortunes(dir_ / "corpus.txt", docs_);
    lt::data::trainTokenizer({corpus_.string()}, kVocab, (dir_ / "tok").string(), "%\n");
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }
  static fs::path modelPath() { return dir_ / "tok.model"; }
  static inline fs::path dir_, corpus_;
  static inline std::vector<std::string> docs_;
};

TEST_F(Tokenize, TrainedModelRoundTripsAnyText) {
  ASSERT_TRUE(fs::is_regular_file(modelPath()));
  EXPECT_TRUE(fs::is_regular_file(dir_ / "tok.vocab"));
  Tokenizer tok(modelPath().string());
  EXPECT_EQ(tok.path(), modelPath().string());
  EXPECT_GT(tok.vocabSize(), 259);  // 256 bytes + unk, bos, eos, and more
  EXPECT_LE(tok.vocabSize(), kVocab);
  EXPECT_EQ(tok.bosId(), 1);
  EXPECT_EQ(tok.eosId(), 2);
  const std::vector<std::string> texts = {
      docs_[0], docs_[1] + docs_[2], "The small river runs.", " leading space", "two  spaces and trailing ",
      "lines\n\nand\ttabs\r\n", "unseen: 日本語 😀 ∑ Ω", "", " ", "\n"};
  for (const auto& t : texts) {
    const auto ids = tok.encode(t);
    EXPECT_EQ(tok.decode(ids), t) << "text [" << t << "]";
    for (int64_t id : ids) {
      EXPECT_NE(id, tok.eosId()) << "encode adds no EOS";
      EXPECT_NE(id, tok.bosId()) << "encode adds no BOS";
    }
  }
  EXPECT_TRUE(tok.encode("").empty());
  // The training text compresses: well under one token per byte.
  EXPECT_LT(tok.encode(docs_[3]).size(), docs_[3].size() / 2);
}

TEST_F(Tokenize, TrainingIsDeterministicAndBpeWorks) {
  lt::data::trainTokenizer({corpus_.string()}, kVocab, (dir_ / "again").string(), "%\n");
  auto bytes = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  // The .vocab lists every piece and score; the .model also records the (temporary) input path.
  EXPECT_TRUE(bytes(dir_ / "again.vocab") == bytes(dir_ / "tok.vocab"));
  lt::data::trainTokenizer({corpus_.string()}, kVocab, (dir_ / "bpe").string(), "%\n", "bpe");
  Tokenizer bpe((dir_ / "bpe.model").string());
  for (const std::string& t : {docs_[5], std::string("unseen ✓ ß")}) EXPECT_EQ(bpe.decode(bpe.encode(t)), t);
}

TEST_F(Tokenize, SplitOnGivesOneEosPerDocument) {
  // Two files; the second has blank records, which are no documents.
  const auto more = makeDocuments(40, 99);
  const fs::path second = dir_ / "second.txt";
  {
    std::ofstream f(second, std::ios::binary);
    f << "%\n";
    for (const auto& d : more) f << d << "%\n  \n%\n";
  }
  lt::data::TokenizeOptions o;
  o.tokenizerPath = modelPath().string();
  o.outPath = (dir_ / "data.bin").string();
  o.inputs = {corpus_.string(), second.string()};
  o.splitOn = "%\n";
  o.progress = false;
  const auto r = lt::data::tokenizeFiles(o);
  std::vector<std::string> want = docs_;
  want.insert(want.end(), more.begin(), more.end());
  EXPECT_EQ(r.documents, static_cast<int64_t>(want.size()));
  EXPECT_EQ(r.bytesPerToken, 2);
  EXPECT_EQ(r.eosId, 2);
  EXPECT_FALSE(fs::exists(dir_ / "data.bin.tmp"));
  ASSERT_EQ(static_cast<int64_t>(fs::file_size(o.outPath)), r.tokens * 2);  // uint16, no header
  const auto tokens = readUint16(o.outPath);
  ASSERT_FALSE(tokens.empty());
  EXPECT_EQ(tokens.back(), 2) << "EOS after the last document too";
  Tokenizer tok(modelPath().string());
  std::vector<std::string> got;
  std::vector<int64_t> segment;
  for (uint16_t t : tokens) {
    if (t == tok.eosId()) {
      got.push_back(tok.decode(segment));
      segment.clear();
    } else {
      segment.push_back(t);
    }
  }
  EXPECT_TRUE(segment.empty());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], want[i]) << "document " << i;
}

// A document longer than the encoding chunk (64 KiB) gives the ids of one whole-text encode.
TEST_F(Tokenize, LongDocumentEncodesAsOneText) {
  std::string text;
  for (const auto& d : makeDocuments(1500, 3)) text += d;
  ASSERT_GT(text.size(), size_t{150000});
  const fs::path book = dir_ / "book.txt";
  std::ofstream(book, std::ios::binary) << text;
  lt::data::TokenizeOptions o;
  o.tokenizerPath = modelPath().string();
  o.outPath = (dir_ / "book.bin").string();
  o.inputs = {book.string()};
  o.progress = false;
  const auto r = lt::data::tokenizeFiles(o);
  EXPECT_EQ(r.documents, 1);
  Tokenizer tok(modelPath().string());
  std::vector<int64_t> want = tok.encode(text);
  want.push_back(tok.eosId());
  const auto tokens = readUint16(o.outPath);
  ASSERT_EQ(tokens.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(tokens[i], want[i]) << "token " << i;
}

TEST_F(Tokenize, SplitDocumentsDropsBlankRecords) {
  using lt::data::splitDocuments;
  EXPECT_EQ(splitDocuments("a\n%\nb\n%\n", "%\n"), (std::vector<std::string_view>{"a\n", "b\n"}));
  EXPECT_EQ(splitDocuments("p one\n\n\n\np two", "\n\n"), (std::vector<std::string_view>{"p one", "p two"}));
  EXPECT_EQ(splitDocuments("whole\n\nfile", ""), (std::vector<std::string_view>{"whole\n\nfile"}));
  EXPECT_TRUE(splitDocuments(" \n", "").empty());
}

TEST_F(Tokenize, BadInputsAreNamedErrors) {
  using lt::testing::errorOf;
  const std::string missing = (dir_ / "nope.model").string();
  EXPECT_NE(errorOf([&] { Tokenizer t(missing); }).find("tokenizer '" + missing + "' does not exist"),
            std::string::npos);
  EXPECT_NE(errorOf([&] { Tokenizer t(corpus_.string()); }).find("is neither a SentencePiece model"),
            std::string::npos);
  lt::data::TokenizeOptions o;
  o.tokenizerPath = modelPath().string();
  o.outPath = (dir_ / "bad.bin").string();
  o.inputs = {corpus_.string(), dir_.string()};
  o.progress = false;
  EXPECT_NE(errorOf([&] { lt::data::tokenizeFiles(o); }).find("input '" + dir_.string() + "' is a directory"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(o.outPath));
  EXPECT_FALSE(fs::exists(o.outPath + ".tmp"));
  o.inputs = {corpus_.string()};
  o.outPath = (dir_ / "no/such/dir/x.bin").string();
  EXPECT_NE(errorOf([&] { lt::data::tokenizeFiles(o); }).find("cannot write token file"), std::string::npos);
  const std::string small =
      errorOf([&] { lt::data::trainTokenizer({corpus_.string()}, 270, (dir_ / "small").string(), "%\n"); });
  EXPECT_NE(small.find("vocabulary size 270 is too small for this corpus"), std::string::npos) << small;
  EXPECT_NE(errorOf([&] { lt::data::trainTokenizer({corpus_.string()}, 200, (dir_ / "tiny").string()); })
                .find("use at least 260"),
            std::string::npos);
}

TEST_F(Tokenize, CommandLineTrainsThenTokenizes) {
  const fs::path d = lt::testing::freshTempDir("longtrain_tokenizer_test_cli_" + std::to_string(::getpid()));
  const fs::path corpus = writeFortunes(d / "corpus.txt", makeDocuments(200, 11));
  const std::string inDir = "env -C " + d.string() + " ";  // runCommand prefixes `timeout`: no `cd`
  auto r = lt::testing::runCommand(inDir + kBin + " tokenize --train-tokenizer " +
                                   std::to_string(kVocab) + " --tokenizer T.model --split-on '%\\n' --out D.bin " +
                                   corpus.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(fs::is_regular_file(d / "T.model"));
  EXPECT_TRUE(fs::is_regular_file(d / "D.bin"));
  for (const char* s : {"tokenizer: trained unigram", "200 documents", "2 bytes per token", "EOS id 2",
                        "tokens/s", "\"type\": \"uint16\"", "\"packing\": \"documents\"", "model.vocab_size >="})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  // Without --out: the first input's stem + .bin, in the current directory.
  r = lt::testing::runCommand(inDir + kBin + " tokenize --tokenizer T.model " + corpus.string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("1 documents"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_regular_file(d / "corpus.bin"));
  r = lt::testing::runCommand(kBin + " tokenize --tokenizer " + (d / "T.model").string() + " --split-on '%\\q' " +
                              corpus.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("is not an escape"), std::string::npos) << r.out;
}

// A run trained with a SentencePiece model exports it as tokenizer.model, beside a
// tokenizer_config.json (which SentencePiece has none of: written) naming BOS and EOS, and
// config.json carries their ids, so Hugging Face's AutoTokenizer loads the directory.
TEST_F(Tokenize, ExportWritesTheTokenizerUnderItsStandardNames) {
  const fs::path d = lt::testing::freshTempDir("longtrain_tokenizer_export_" + std::to_string(::getpid()));
  auto r = lt::testing::runCommand(kBin + " tokenize --tokenizer " + modelPath().string() + " --split-on '%\\n' --out " +
                                   (d / "d.bin").string() + " " + corpus_.string());
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json cfg = lt::testing::tinyTrainConfig();
  cfg["model"]["vocab_size"] = kVocab;
  cfg["data"] = {{"type", "uint16"}, {"path", (d / "d.bin").string()}, {"seq_len", 32}, {"tokenizer", modelPath().string()}};
  cfg["train"] = {{"steps", 1}, {"checkpoint", {{"dir", (d / "ck").string()}, {"every_steps", 1}}}};
  const fs::path cfgFile = lt::testing::writeJsonFile(d.filename().string(), "c.json", cfg);
  r = lt::testing::runCommand(kBin + " train " + cfgFile.string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = lt::testing::runCommand(kBin + " export " + (d / "ck").string() + " --out " + (d / "hf").string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : {"tokenizer.model", "tokenizer_config.json", "config.json", "model.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(d / "hf" / f)) << f << "\n" << r.out;
  const Tokenizer tok(modelPath().string());
  std::ifstream tc(d / "hf" / "tokenizer_config.json"), cj(d / "hf" / "config.json");
  const auto tokConfig = nlohmann::json::parse(tc), config = nlohmann::json::parse(cj);
  EXPECT_EQ(tokConfig.value("tokenizer_class", ""), "LlamaTokenizer");
  EXPECT_EQ(tokConfig.value("eos_token", ""), "</s>");
  EXPECT_EQ(tokConfig.value("bos_token", ""), "<s>");
  EXPECT_EQ(config.value("eos_token_id", int64_t{-1}), tok.eosId());
  EXPECT_EQ(config.value("bos_token_id", int64_t{-1}), tok.bosId());
}

}  // namespace
