// JSON text from a user (a config, a --set value, a model's config.json, a tokenizer.json, a
// sidecar) parsed with errors a user can act on: the line and column of a syntax error, and a
// refusal of nesting deeper than kMaxJsonDepth before the parser sees it (nlohmann's recursive
// destructor overflows the stack on a few hundred thousand levels: SIGSEGV).
#pragma once
#include <nlohmann/json.hpp>

#include <string>

namespace lt::config {

constexpr int kMaxJsonDepth = 512;

// `what` names the source in errors ("config file 'x.json'"). Comments are allowed when
// `comments` (configs); lt::Error on any problem.
// lt::Error (naming line and column) where `text` nests deeper than kMaxJsonDepth.
void checkJsonDepth(const std::string& text, const std::string& what, bool comments = false);
nlohmann::json parseJsonText(const std::string& text, const std::string& what, bool comments = false);
// The whole of a regular file (not a FIFO or a device, which would block or never end).
std::string readJsonFile(const std::string& path, const std::string& what);
// readJsonFile, then parseJsonText: every JSON file the program reads comes through here.
nlohmann::json readJson(const std::string& path, const std::string& what, bool comments = false);

}  // namespace lt::config
