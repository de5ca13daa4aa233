// `longtrain tokenize`: text files into a token file (EOS after every document) with its
// sidecar, training a SentencePiece tokenizer on them first if asked. Non-obvious: the output
// is refused when it is one of the inputs, before anything is written.
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "longtrain/cli/command.h"
#include "longtrain/core/check.h"
#include "longtrain/data/text.h"
#include "longtrain/data/tokenizer.h"

namespace lt::cli {

namespace {

namespace fs = std::filesystem;

struct TokenizeFlags {
  std::string tokenizer, out, splitOn, tokenizerType = "unigram";
  int64_t trainVocab = 0;  // 0: use --tokenizer as it is
  std::vector<std::string> inputs;
};

void trainFirst(const TokenizeFlags& f, const std::string& sep) {
  const std::string suffix = ".model";
  LT_CHECK(f.tokenizer.size() > suffix.size() &&
               f.tokenizer.compare(f.tokenizer.size() - suffix.size(), suffix.size(), suffix) == 0,
           "--tokenizer '", f.tokenizer, "' must end in .model with --train-tokenizer (SentencePiece writes ",
           "<prefix>.model and <prefix>.vocab)");
  const std::string prefix = f.tokenizer.substr(0, f.tokenizer.size() - suffix.size());
  const auto t0 = std::chrono::steady_clock::now();
  data::trainTokenizer(f.inputs, f.trainVocab, prefix, sep, f.tokenizerType);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("tokenizer: trained %s, vocabulary %lld (asked %lld), on %zu file(s) in %.2f s -> %s, %s.vocab\n",
              f.tokenizerType.c_str(), (long long)data::Tokenizer(f.tokenizer).vocabSize(), (long long)f.trainVocab,
              f.inputs.size(), s, f.tokenizer.c_str(), prefix.c_str());
}

void printResult(const data::TokenizeResult& r, const std::string& out) {
  const char* type = r.bytesPerToken == 2 ? "uint16" : "uint32";
  std::printf("tokenize: %lld documents, %lld tokens -> %s (%.1f MB; %s, %d bytes per token, EOS after every "
              "document)\n",
              (long long)r.documents, (long long)r.tokens, out.c_str(), r.tokens * r.bytesPerToken / 1e6, type,
              r.bytesPerToken);
  std::printf("  vocabulary %lld, EOS id %lld; %.1f MB of text in %.2f s (%.1f MB/s, %.0f tokens/s)\n",
              (long long)r.vocabSize, (long long)r.eosId, r.bytesRead / 1e6, r.seconds,
              r.bytesRead / 1e6 / std::max(r.seconds, 1e-9), r.tokens / std::max(r.seconds, 1e-9));
  std::printf("  sidecar: %s.json (the tokenizer, its SHA-256, dtype and EOS: data.packing and eval read them)\n",
              out.c_str());
  std::error_code ec;
  std::printf("  config: \"data\": {\"type\": \"%s\", \"path\": \"%s\", \"packing\": \"documents\"} with "
              "model.vocab_size >= %lld\n",
              type, fs::absolute(out, ec).string().c_str(), (long long)r.vocabSize);
}

int runTokenize(const TokenizeFlags& f) {
  const std::string sep = data::unescapeSeparator(f.splitOn, "--split-on");
  const std::string out = f.out.empty() ? fs::path(f.inputs.front()).stem().string() + ".bin" : f.out;
  for (const auto& in : f.inputs) {
    std::error_code ec;
    LT_CHECK(!fs::equivalent(in, out, ec), "the output '", out, "' is the input '", in, "'; give another --out");
  }
  if (f.trainVocab > 0) trainFirst(f, sep);
  data::TokenizeOptions o;
  o.tokenizerPath = f.tokenizer;
  o.outPath = out;
  o.inputs = f.inputs;
  o.splitOn = sep;
  printResult(data::tokenizeFiles(o), out);
  return 0;
}

}  // namespace

Command tokenizeCommand(CLI::App& app) {
  auto f = std::make_shared<TokenizeFlags>();
  auto* tok = app.add_subcommand("tokenize", "turn text files into a token file for data.type uint16/uint32 "
                                             "(EOS after every document), training the tokenizer first if asked");
  tok->add_option("FILE", f->inputs, "text files (each one document, or split by --split-on)")->required();
  tok->add_option("--tokenizer", f->tokenizer, "a Hugging Face tokenizer.json, a SentencePiece .model, or a "
                                               "model directory holding one (a .model to write, with "
                                               "--train-tokenizer)")->required();
  tok->add_option("--out", f->out, "the token file to write (default: the first FILE's name + .bin, here)");
  tok->add_option("--split-on", f->splitOn, "separator between documents inside a file, escapes \\n \\t "
                                            "(e.g. '%\\n' for fortune files, '\\n\\n' for paragraphs)");
  tok->add_option("--train-tokenizer", f->trainVocab, "first train a tokenizer of this vocabulary size on "
                                                      "the FILEs and write it at --tokenizer")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 30));
  tok->add_option("--tokenizer-type", f->tokenizerType, "with --train-tokenizer: unigram (default) or bpe")
      ->check(CLI::IsMember({"unigram", "bpe"}));
  return {tok, [f] { return runTokenize(*f); }};
}

}  // namespace lt::cli
