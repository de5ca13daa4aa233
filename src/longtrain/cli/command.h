// The subcommands of `longtrain`, one file each: a factory registers its options on the app and
// returns how to run it. Non-obvious: each factory keeps its flags alive in the closure it
// returns, so main() holds no per-command state and stays a list of registrations.
#pragma once
#include <CLI/CLI.hpp>
#include <nlohmann/json_fwd.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "longtrain/config/options.h"
#include "longtrain/plan/time_model.h"

namespace lt::cli {

struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;  // the exit status
};

// argv: the command line, which the launcher re-runs in each rank.
Command trainCommand(CLI::App& app, int argc, char** argv);
Command evalCommand(CLI::App& app, int argc, char** argv);
Command planCommand(CLI::App& app);
Command configCommand(CLI::App& app);
Command exportCommand(CLI::App& app);
Command generateCommand(CLI::App& app);
Command tokenizeCommand(CLI::App& app);
Command plotCommand(CLI::App& app);
Command infoCommand(CLI::App& app);

// A flag that takes an option enum's names (config/options.h), `accepted` of them (empty: all).
// Non-obvious: CLI11 reads an enum from its integer, so the validator rewrites the name to it;
// a name outside the set is refused in longtrain's words, not CLI11's.
template <class E>
CLI::Validator optionChoices(std::initializer_list<E> accepted = {}) {
  std::map<std::string, E> names;
  std::string shown;  // "{a, b}"
  for (const auto& [value, name] : config::OptionNames<E>::kAll)
    if (accepted.size() == 0 || std::find(accepted.begin(), accepted.end(), value) != accepted.end()) {
      names.emplace(name, value);
      shown += (shown.empty() ? "" : ", ") + std::string(name);
    }
  shown = "{" + shown + "}";
  return CLI::Validator(
      [names, shown](std::string& in) -> std::string {
        const auto it = names.find(in);
        if (it == names.end()) return "'" + in + "' is not one of " + shown;
        in = std::to_string(static_cast<int>(it->second));
        return "";
      },
      shown);
}

// `plan --fit` and `train --fit`: prints the fit search's report for the config at `path` with
// `sets`, on `at`'s ranks (across nodes, their link at `linkSecondsPerByte`) within `budget` bytes
// a rank, and returns the chosen candidate's --set flags (`how` introduces them in the report);
// an error when nothing fits.
std::vector<std::string> fitSets(const std::string& path, const std::vector<std::string>& sets,
                                 const plan::Placement& at, double linkSecondsPerByte, int64_t budget, const char* how);

// --nproc wins; else the config's train.nproc (validated later by parseConfig); else 1.
int nprocOf(const nlohmann::json& j, int nprocFlag);

}  // namespace lt::cli
