// Property tests over malformed input (the fuzzing, without a clang toolchain): the
// config parser, the token-file reader, the checkpoint manifest reader and the safetensors
// header parser are fed mutated versions of valid inputs (byte flips, insertions, deletions,
// truncations, splices, and JSON-level replacements of any value with any type). Each input
// must be accepted, or refused with an lt::Error; any other exception fails the test and
// prints the input. A crash or hang fails the test binary (ctest's timeout). Seeds are fixed,
// so a failure reproduces; LONGTRAIN_FUZZ_SCALE multiplies the input counts. Issue 33's
// classes too: every JSON file reader against deep nesting, mutations and non-regular files,
// and every count key at the top of its range.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <sys/stat.h>

#include "longtrain/ckpt/checkpoint.h"
#include "longtrain/ckpt/hf_llama.h"
#include "longtrain/ckpt/manifest.h"
#include "longtrain/ckpt/safetensors.h"
#include "longtrain/config/hf_llama_config.h"
#include "longtrain/config/token_sidecar.h"
#include "longtrain/core/check.h"
#include "longtrain/data/data.h"
#include "longtrain/data/tokenizer.h"
#include "longtrain/plan/preflight.h"
#include "longtrain/report/plot.h"
#include "longtrain/train/engine.h"
#include "testing.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Rng {
  uint64_t s;
  uint64_t next() {  // splitmix64
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? next() % n : 0; }
};

int64_t scaled(int64_t n) {
  const char* s = std::getenv("LONGTRAIN_FUZZ_SCALE");
  return s ? n * std::max(1, std::atoi(s)) : n;
}

// Byte-level mutations of a valid input.
std::string mutateBytes(const std::string& in, Rng& r) {
  std::string s = in;
  static const char* kTokens[] = {"{", "}", "[", "]", ",", ":", "\"", "-", "0", "1e999", "null", "true",
                                  "\"\\u0000\"", "-1", "9223372036854775808", "1.5", " ", "\\", "\xff", "\x00"};
  const int n = 1 + static_cast<int>(r.below(4));
  for (int k = 0; k < n && !s.empty(); ++k) {
    size_t at = r.below(s.size());
    switch (r.below(6)) {
      case 0: s[at] = static_cast<char>(s[at] ^ (1 << r.below(8))); break;
      case 1: s[at] = static_cast<char>(r.next()); break;
      case 2: s.erase(at, 1 + r.below(16)); break;
      case 3: s.insert(at, kTokens[r.below(sizeof kTokens / sizeof *kTokens)]); break;
      case 4: s.resize(at); break;
      case 5: {  // splice: duplicate a random slice elsewhere
        size_t from = r.below(s.size()), len = r.below(32);
        s.insert(at, s.substr(from, len));
        break;
      }
    }
  }
  return s;
}

json randomValue(Rng& r) {
  switch (r.below(14)) {
    case 0: return nullptr;
    case 1: return true;
    case 2: return -1;
    case 3: return 0;
    case 4: return 1e300;
    case 5: return -1e300;
    case 6: return 2.5;
    case 7: return std::numeric_limits<int64_t>::max();
    case 8: return std::numeric_limits<uint64_t>::max();
    case 9: return "x";
    case 10: return json::array();
    case 11: return json::object();
    case 12: return json::array({1, "a", nullptr});
    default: return static_cast<int64_t>(r.below(100000)) - 50000;
  }
}

// JSON-level mutation: replace, delete or add at a random node.
void mutateJson(json& j, Rng& r, int depth = 0) {
  if (j.is_object() && !j.empty() && depth < 8 && r.below(3) != 0) {
    auto it = j.begin();
    std::advance(it, r.below(j.size()));
    if (r.below(6) == 0) {
      j.erase(it);
    } else if (r.below(8) == 0) {
      j[it.key() + "_"] = randomValue(r);  // an unknown key
    } else {
      mutateJson(*it, r, depth + 1);
    }
    return;
  }
  if (j.is_array() && !j.empty() && depth < 8 && r.below(3) != 0) {
    if (r.below(6) == 0) j.erase(r.below(j.size()));
    else mutateJson(j[r.below(j.size())], r, depth + 1);
    return;
  }
  j = randomValue(r);
}

// Runs `f` on an input; only lt::Error may escape. Returns false (and prints) otherwise.
template <class F>
bool survives(F&& f, const std::string& what, const std::string& input, int* rejected) {
  try {
    f();
  } catch (const lt::Error&) {
    ++*rejected;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": escaped " << typeid(e).name() << ": " << e.what() << "\ninput: " << input.substr(0, 400);
    return false;
  }
  return true;
}

struct Tally {
  const char* target;
  int64_t inputs = 0;
  int rejected = 0;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~Tally() {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("fuzz %-12s %7lld inputs, %6d refused with lt::Error, %lld accepted, %.1f s\n", target,
                (long long)inputs, rejected, (long long)(inputs - rejected), s);
  }
};

TEST(Fuzz, ConfigParser) {
  Tally t{"config"};
  Rng r{1};
  json base = lt::testing::tinyTrainConfig();
  base["zero_optimization"] = {{"stage", 3}, {"offload_optimizer", {{"device", "cpu"}, {"super_offload", true}}}};
  base["scheduler"] = {{"type", "WarmupCosineLR"}, {"params", {{"total_num_steps", 10}}}};
  base["compile"] = {{"deepcompile", true}, {"schedule", {{0, {"zero3"}}, {2, {"zero3", "prefetch"}}}}};
  base["train"]["checkpoint"] = {{"dir", "/tmp/x"}, {"every_steps", 2}, {"keep_last", 1}};
  base["sequence_parallel_size"] = 2;
  const std::string text = base.dump();
  const int64_t n = scaled(20000);
  for (int64_t i = 0; i < n; ++i, ++t.inputs) {
    std::string in;
    json j;
    if (i % 2 == 0) {
      in = mutateBytes(text, r);
      j = json::parse(in, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) {  // the CLI refuses it as "not valid JSON" before parsing
        ++t.rejected;
        continue;
      }
    } else {
      j = base;
      for (int k = 0, m = 1 + static_cast<int>(r.below(3)); k < m; ++k) mutateJson(j, r);
      in = j.dump();
    }
    const int world = 1 + static_cast<int>(r.below(4));
    if (!survives([&] { lt::config::parseConfig(j, world); }, "config", in, &t.rejected)) return;
  }
}

// The cross-field rules live in one validate(): a config that parseConfig accepts for a world
// must build an engine on that many ranks and take a step, never be refused by a rank after
// launch (as ZeRO stage 1 once was). Random combinations of the keys whose rules span sections
// (ZeRO stage and offload, SP degree and ring, head counts, batch keys, schedules, packing).
TEST(Fuzz, AcceptedConfigsBuildAnEngineAndStep) {
  Tally t{"cross-field"};
  Rng r{7};
  int accepted = 0;
  for (int64_t i = 0; i < scaled(60); ++i, ++t.inputs) {
    json j = lt::testing::tinyTrainConfig();
    auto pick = [&](std::initializer_list<json> v) { return *(v.begin() + r.below(v.size())); };
    const int world = static_cast<int>(pick({1, 2, 4}).get<int>());
    const int stage = static_cast<int>(r.below(4));
    const bool cpu = r.below(2) && (stage > 0 || r.below(4) == 0);
    j["zero_optimization"] = {{"stage", stage},
                              {"offload_optimizer", {{"device", cpu ? "cpu" : "none"},
                                                     {"super_offload", r.below(2) && (cpu || r.below(4) == 0)}}}};
    // Mostly combinations that can work (a divisor of the world, kv heads dividing heads), so
    // most reach the engine; the rest test the refusals.
    j["sequence_parallel_size"] = r.below(5) == 0 ? pick({2, 4}) : json(1 + static_cast<int>(r.below(world)));
    j["sequence_parallel_ring_degree"] = pick({0, 0, 1, 2});
    j["model"]["num_heads"] = pick({1, 2, 4});
    j["model"]["num_kv_heads"] = r.below(5) == 0 ? pick({2, 4}) : json(1 + static_cast<int>(r.below(j["model"]["num_heads"].get<int>())));
    j["model"]["hidden_size"] = pick({16, 24, 32});
    j["data"]["seq_len"] = pick({31, 32});
    if (r.below(2)) j["gradient_accumulation_steps"] = pick({1, 2});
    if (r.below(4) == 0) j["train_batch_size"] = pick({2, 4, 8});
    if (r.below(3) == 0) j["compile"] = {{"deepcompile", true}, {"schedule", pick({json::array({json::array({0, {"zero3"}})}),
                                                                           json::array({json::array({0, {"free_activations"}})})})}};
    j["activation_checkpointing"] = pick({"auto", "all", "none"});
    const std::string in = j.dump();
    lt::config::Config cfg;
    try {
      cfg = lt::config::parseConfig(j, world);
    } catch (const lt::Error&) {
      ++t.rejected;
      continue;
    }
    ++accepted;
    const std::string err = lt::testing::errorOf([&] {
      lt::testing::runRanks(world, cfg.sequenceParallelSize, [&](int, lt::comm::Groups& g) {
        lt::train::Engine e(cfg, g);
        e.step();
      }, std::chrono::milliseconds(30000), cfg.layout.R);
    });
    EXPECT_EQ(err, "") << "world " << world << ": accepted by parseConfig, refused by the engine: " << in;
  }
  EXPECT_GE(accepted, 15);  // the generator must reach the engine, not only the parser's refusals
}

TEST(Fuzz, ManifestReader) {
  Tally t{"manifest"};
  // A real manifest of a ZeRO-3 checkpoint at world 2.
  auto root = lt::testing::freshTempDir(fs::path("longtrain_fuzz") / "manifest");
  json cfg = lt::testing::tinyTrainConfig();
  cfg["zero_optimization"] = {{"stage", 3}};
  lt::testing::runRanks(2, 1, [&](int, lt::comm::Groups& g) {
    lt::train::Engine e(lt::config::parseConfig(cfg, 2), g);
    e.step();
    lt::ckpt::save(e, root.string(), 0);
  });
  const std::string dir = lt::ckpt::findLatest(root.string());
  std::ifstream f(dir + "/manifest.json");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const json base = json::parse(text);
  Rng r{2};
  const int64_t n = scaled(20000);
  for (int64_t i = 0; i < n; ++i, ++t.inputs) {
    std::string in;
    if (i % 2 == 0) {
      in = mutateBytes(text, r);
    } else {
      json j = base;
      for (int k = 0, m = 1 + static_cast<int>(r.below(3)); k < m; ++k) mutateJson(j, r);
      in = j.dump();
    }
    if (!survives([&] { lt::ckpt::parseManifest(in, "manifest"); }, "manifest", in, &t.rejected)) return;
  }
  // Through the whole open path (files listed by a mutated manifest are looked up, sized
  // and checksummed): a sample of structural mutations, written over a copy.
  auto copy = root / "copy";
  fs::create_directories(copy);
  for (const auto& e : fs::directory_iterator(dir)) fs::copy_file(e.path(), copy / e.path().filename());
  for (int64_t i = 0; i < scaled(400); ++i, ++t.inputs) {
    json j = base;
    mutateJson(j["files"], r);
    std::ofstream(copy / "manifest.json", std::ios::trunc) << j.dump();
    if (!survives([&] { lt::ckpt::Checkpoint c(copy.string()); }, "checkpoint open", j.dump(), &t.rejected)) return;
  }
}

TEST(Fuzz, SafetensorsHeader) {
  Tally t{"safetensors"};
  auto p = fs::temp_directory_path() / "longtrain_fuzz" / "st.safetensors";
  fs::create_directories(p.parent_path());
  lt::ckpt::writeSafetensors(p.string(),
                             {{"a", at::randn({3, 4})}, {"b", at::arange(6, at::kLong)}, {"c", at::zeros({0})},
                              {"d", at::ones({5}).to(at::kBFloat16)}},
                             {{"k", "v"}});
  std::ifstream f(p, std::ios::binary);
  const std::string img((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= static_cast<uint64_t>(static_cast<uint8_t>(img[i])) << (8 * i);
  const json header = json::parse(img.substr(8, hlen));
  Rng r{3};
  const int64_t n = scaled(30000);
  for (int64_t i = 0; i < n; ++i, ++t.inputs) {
    std::string in;
    switch (i % 3) {
      case 0: in = mutateBytes(img, r); break;
      case 1: {  // header JSON mutated, length prefix kept consistent
        json h = header;
        mutateJson(h, r);
        std::string hs = h.dump();
        in.resize(8);
        for (int k = 0; k < 8; ++k) in[k] = static_cast<char>(hs.size() >> (8 * k));
        in += hs + img.substr(8 + hlen);
        break;
      }
      default: {  // a lying length prefix
        in = img;
        uint64_t v = r.below(2) ? r.next() : hlen + r.below(64) - 32;
        for (int k = 0; k < 8; ++k) in[k] = static_cast<char>(v >> (8 * k));
      }
    }
    auto parse = [&] {
      auto h = lt::ckpt::parseSafetensors(reinterpret_cast<const uint8_t*>(in.data()), in.size(), "input");
      for (const auto& e : h.tensors)  // accepted: every tensor lies inside the input
        ASSERT_LE(static_cast<uint64_t>(h.dataOffset + e.end), in.size());
    };
    if (!survives(parse, "safetensors", in, &t.rejected)) return;
  }
}

TEST(Fuzz, TokenFileReader) {
  Tally t{"token file"};
  auto p = fs::temp_directory_path() / "longtrain_fuzz" / "tokens.bin";
  fs::create_directories(p.parent_path());
  Rng r{4};
  const int64_t n = scaled(3000);
  for (int64_t i = 0; i < n; ++i, ++t.inputs) {
    const size_t bytes = r.below(4) == 0 ? r.below(8) : r.below(4096);
    std::string content(bytes, '\0');
    for (auto& c : content) c = static_cast<char>(r.below(4) == 0 ? r.next() : r.below(8));
    std::ofstream(p, std::ios::binary | std::ios::trunc) << content;
    const int width = std::array<int, 3>{1, 2, 4}[r.below(3)];
    const int64_t seq = static_cast<int64_t>(r.below(5) == 0 ? r.next() % 1000000 : r.below(64)) - 2;
    const int64_t vocab = static_cast<int64_t>(r.below(300)) - 10;
    auto read = [&] {
      lt::data::TokenFileDataset ds(p.string(), width, seq, vocab);
      for (int64_t k = 0; k < std::min<int64_t>(ds.size(), 4); ++k) {
        auto s = ds.get(static_cast<int64_t>(r.below(static_cast<size_t>(ds.size()))));
        ASSERT_EQ(static_cast<int64_t>(s.ids.size()), seq);
        for (auto id : s.ids) ASSERT_TRUE(id >= 0 && (width == 1 ? id < 256 : id < vocab));
      }
    };
    if (!survives(read, "token file", content.substr(0, 64), &t.rejected)) return;
  }
}

// Every JSON file the program reads, each through its own reader: a file nested 100,000 deep is
// refused naming the depth (not SIGSEGV), and a FIFO, a directory or a device in its place is
// refused at once (a FIFO's open would block: the ctest timeout fails that).
struct JsonReader {
  std::string name, file;                  // file: its path under the test's directory
  std::function<void(const fs::path&)> read;  // reads the directory's `file`
};

std::vector<JsonReader> jsonReaders() {
  return {
      {"token sidecar", "t.bin.json", [](const fs::path& d) { (void)lt::config::readTokenSidecar((d / "t.bin").string()); }},
      {"HF config.json", "config.json", [](const fs::path& d) { (void)lt::config::readHfLlamaConfig(d.string()); }},
      {"safetensors index", "model.safetensors.index.json",
       [](const fs::path& d) { lt::ckpt::HfWeights w(d.string(), "model.init_from"); }},
      {"tokenizer.json", "tokenizer.json", [](const fs::path& d) { lt::data::Tokenizer t((d / "tokenizer.json").string()); }},
      {"checkpoint manifest", "manifest.json", [](const fs::path& d) { lt::ckpt::Checkpoint c(d.string()); }},
      {"metrics JSONL", "m.jsonl", [](const fs::path& d) { (void)lt::report::readMetrics((d / "m.jsonl").string()); }},
  };
}

TEST(Fuzz, JsonFileReadersRefuseDeepNestingAndIrregularFiles) {
  Tally t{"json files"};
  for (const auto& r : jsonReaders()) {
    const fs::path d = lt::testing::freshTempDir(fs::path("longtrain_fuzz") / ("json_" + std::to_string(t.inputs)));
    const fs::path f = d / r.file;
    std::ofstream(f) << "{\"a\": " << std::string(100000, '[') << std::string(100000, ']') << "}\n";
    std::string e = lt::testing::errorOf([&] { r.read(d); });
    ++t.inputs, ++t.rejected;
    EXPECT_NE(e.find("nested deeper than"), std::string::npos) << r.name << ": " << e;
    for (const char* kind : {"fifo", "directory", "device"}) {
      fs::remove_all(f);
      const bool made = std::string(kind) == "fifo"        ? ::mkfifo(f.c_str(), 0600) == 0
                        : std::string(kind) == "directory" ? fs::create_directory(f)
                                                           : ::symlink("/dev/zero", f.c_str()) == 0;
      ASSERT_TRUE(made) << kind;
      e = lt::testing::errorOf([&] { r.read(d); });
      ++t.inputs, ++t.rejected;
      EXPECT_TRUE(e.find("is not a regular file") != std::string::npos || e.find("is a directory") != std::string::npos ||
                  e.find("holds neither") != std::string::npos)
          << r.name << " as a " << kind << ": " << e;
    }
  }
}

// Mutated token sidecars and Hugging Face config.json files: accepted, or refused with lt::Error.
TEST(Fuzz, SidecarAndHfConfigReaders) {
  Tally t{"sidecar+hf"};
  const fs::path d = lt::testing::freshTempDir(fs::path("longtrain_fuzz") / "sidecar");
  lt::config::TokenSidecar side;
  side.dtype = "uint16", side.tokenizer = "/nonexistent/tokenizer.json", side.eosId = 2, side.tokens = 10;
  const std::string sideText = lt::config::tokenSidecarJson(side);
  std::ifstream hf(fs::path(LONGTRAIN_SOURCE_DIR) / "tests" / "fixtures" / "hf_llama" / "gqa_untied" / "config.json");
  const std::string hfText((std::istreambuf_iterator<char>(hf)), std::istreambuf_iterator<char>());
  Rng r{11};
  for (int64_t i = 0; i < scaled(4000); ++i, ++t.inputs) {
    const bool sidecar = i % 2 == 0;
    const std::string& base = sidecar ? sideText : hfText;
    std::string in;
    if (i % 4 < 2) {
      in = mutateBytes(base, r);
    } else {
      json j = json::parse(base);
      for (int k = 0, m = 1 + static_cast<int>(r.below(3)); k < m; ++k) mutateJson(j, r);
      in = j.dump();
    }
    std::ofstream(d / (sidecar ? "t.bin.json" : "config.json"), std::ios::trunc) << in;
    auto read = [&] {
      if (sidecar) (void)lt::config::readTokenSidecar((d / "t.bin").string());
      else (void)lt::config::readHfLlamaConfig(d.string());
    };
    if (!survives(read, sidecar ? "sidecar" : "hf config.json", in, &t.rejected)) return;
  }
}

// Every integer key at the top of its range (each alone in range, 2^50): refused with lt::Error
// by parse, validate, the preflights or the engine, or else the engine builds, steps and
// evaluates; never std::bad_alloc (or a hang: the ctest timeout).
TEST(Fuzz, EveryCountKeyAtTheTopOfItsRange) {
  Tally t{"counts"};
  const std::vector<std::string> keys = {
      "/train_batch_size", "/train_micro_batch_size_per_gpu", "/gradient_accumulation_steps", "/steps_per_print",
      "/seed", "/zero_optimization/sub_group_size", "/zero_optimization/reduce_bucket_size",
      "/zero_optimization/allgather_bucket_size", "/zero_optimization/stage3_prefetch_bucket_size",
      "/zero_optimization/stage3_param_persistence_threshold", "/zero_optimization/stage3_max_live_parameters",
      "/model/vocab_size", "/model/hidden_size", "/model/intermediate_size", "/model/attention_chunk",
      "/model/loss_chunk", "/data/seq_len", "/data/num_samples", "/data/eval_samples", "/data/eos_id",
      "/data/kv/num_pairs", "/data/kv/num_queries", "/data/kv/num_keys", "/data/kv/num_values", "/data/kv/num_noise",
      "/train/steps", "/train/eval_every", "/train/sample_every"};
  const int64_t big = int64_t{1} << 50;
  for (const auto& key : keys) {
    ++t.inputs;
    json j = lt::testing::tinyTrainConfig();
    j["data"]["eval_samples"] = 4;
    j[json::json_pointer(key)] = big;
    lt::config::Config cfg;
    try {
      cfg = lt::config::parseConfig(j, 1);
      lt::plan::preflightCounts(cfg, 1);
      lt::plan::preflightMemory(cfg, 1, 1);
    } catch (const lt::Error&) {
      ++t.rejected;
      continue;
    } catch (const std::exception& e) {
      ADD_FAILURE() << key << ": escaped " << e.what();
      continue;
    }
    try {  // an lt::Error here (the loader's "fewer than one global batch") is a refusal too
      if (!lt::testing::errorOf([&] {
            lt::testing::runRanks(1, 1, [&](int, lt::comm::Groups& g) {
              lt::train::Engine e(cfg, g);
              e.step();
              (void)e.evaluate();
            });
          }).empty())
        ++t.rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << key << " = 2^50 passed the preflights, then escaped: " << e.what();
    }
  }
}

}  // namespace
