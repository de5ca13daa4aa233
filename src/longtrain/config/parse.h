// Reading a config: the JSON file (comments allowed, duplicate keys refused), `--set`
// overrides, then every section read strictly over its defaults (config/config.h): an unknown
// key is an error naming its path and the closest known key; a wrong type or range names the
// path, the value and what is expected. parseConfig ends with validate(), so whatever it
// returns is a config every rank accepts.
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <map>
#include <string>
#include <vector>

#include "longtrain/config/config.h"

namespace lt::config {

// Parses every section and validates the result for a job of `world` ranks (validate.h).
Config parseConfig(const nlohmann::json& j, int world);
Config loadConfig(const std::string& path, const std::vector<std::string>& overrides, int world);
// The config file as JSON with the overrides applied (not validated yet).
nlohmann::json loadConfigJson(const std::string& path, const std::vector<std::string>& overrides);

// Every key of the config as given (c.source, after --set and init_from), dotted path -> JSON
// text: what every rank of a job must hold the same (comm::BringUpOptions::agreed).
std::map<std::string, std::string> agreedKeys(const Config& c);

// Applies one `--set a.b.c=VALUE` override (VALUE is JSON; a bare word is taken as a string).
void applyOverride(nlohmann::json& j, const std::string& assignment);

}  // namespace lt::config
