// The `longtrain` command: registers the subcommands (cli/command.h, one file each), parses the
// command line, runs the one given, and turns any failure into one line on stderr and exit 1.
// Non-obvious: main() may re-execute the program once before anything runs, to swap a BLAS
// kernel that is wrong for this CPU or shorten OpenMP's spin (core/cpu.h), so nothing may happen
// before that call.
#include <ATen/Context.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>

#include "longtrain/cli/command.h"
#include "longtrain/comm/bring_up.h"
#include "longtrain/core/cpu.h"
#include "longtrain/core/phase.h"
#include "longtrain/core/strings.h"

namespace {

// A failed command's message on stderr (naming the rank inside a job), exit status 1. An
// allocation failure names the phase it happened in (core/phase.h) and points to `plan`.
int reportFailure(const char* what, bool badAlloc) {
  const int rank = lt::comm::envInt("RANK", 0);
  const bool inJob = std::getenv("WORLD_SIZE") != nullptr;
  const std::string where = inJob ? " on rank " + std::to_string(rank) : "";
  if (badAlloc) {
    std::fprintf(stderr, "longtrain: error%s: out of memory (std::bad_alloc) while %s; `longtrain plan` predicts "
                 "the peak: lower data.seq_len or the micro batch, or spread the state (ZeRO-3, "
                 "sequence_parallel_size)\n", where.c_str(), lt::currentPhase());
    return 1;
  }
  // ATen reports a failed allocation as its own error ("can't allocate memory"): same hint.
  const bool oom = std::strstr(what, "can't allocate memory") != nullptr;
  const std::string text = oom ? lt::firstLine(what) + " (out of memory while " + lt::currentPhase() +
                                     "; `longtrain plan` predicts the peak)"
                               : std::string(what);
  std::fprintf(stderr, "longtrain: error%s: %s\n", where.c_str(), text.c_str());
  return 1;
}

// CLI11's parse with longtrain's exit codes: help and version exit 0, every usage error 1 with
// CLI11's message (its own codes are 105-109). An option given an empty value ("") is refused:
// CLI11 takes `--max-seq ""` as absent, so a script's empty variable would go unnoticed.
// Returns -1 to go on, else the exit status.
int parseCommandLine(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 1;
  }
  for (const CLI::App* sub : app.get_subcommands())
    for (const CLI::Option* o : sub->get_options()) {
      if (o->count() == 0 || o->get_expected_min() == 0) continue;  // absent, or a flag / optional value
      for (const std::string& v : o->results())
        if (v.empty()) {
          std::fprintf(stderr, "longtrain: error: %s %s was given an empty value; give one, or leave the option out "
                       "(see longtrain %s --help)\n", sub->get_name().c_str(), o->get_name().c_str(),
                       sub->get_name().c_str());
          return 1;
        }
    }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  // May re-execute this program once, before anything runs; for `train` also for the OpenMP spin,
  // and for `plan`, whose time model measures rates that must match what `train` will see.
  const bool trainOrPlan = argc > 1 && (std::strcmp(argv[1], "train") == 0 || std::strcmp(argv[1], "plan") == 0);
  lt::ensureStartEnvironment(argv, trainOrPlan);
  CLI::App app{"longtrain: long-sequence transformer training (Ulysses SP, ZeRO-3/SuperOffload, compile passes)"};
  app.require_subcommand(1);
  const lt::cli::Command commands[] = {
      lt::cli::trainCommand(app, argc, argv), lt::cli::exportCommand(app),   lt::cli::planCommand(app),
      lt::cli::infoCommand(app),              lt::cli::generateCommand(app), lt::cli::tokenizeCommand(app),
      lt::cli::plotCommand(app),              lt::cli::evalCommand(app, argc, argv), lt::cli::configCommand(app)};
  if (const int parsed = parseCommandLine(app, argc, argv); parsed >= 0) return parsed;
  // Flush subnormals to zero before any thread pool exists (new threads inherit the mode):
  // training drives some values (softmax tails, Adam's v) subnormal, and x86 then runs
  // those ops ~100x slower. Measured here: tokens/s fell from 10k to 3.7k within 100 steps.
  at::globalContext().setFlushDenormal(true);
  try {
    for (const auto& c : commands)
      if (*c.app) return c.run();
  } catch (const std::bad_alloc&) {
    return reportFailure("", true);
  } catch (const std::exception& e) {
    return reportFailure(e.what(), false);
  }
  return 0;
}
