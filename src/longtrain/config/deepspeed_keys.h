// DeepSpeed and Hugging Face Trainer spellings a ported config carries, settled before the
// strict parser reads it: "auto" values (the Trainer fills them in), DeepSpeed keys that have
// no effect in longtrain (accepted, and listed once), and DeepSpeed features that would change
// the results and are not implemented (refused, with the reason). Non-obvious: a key is a
// no-op only at values that change nothing (fp16's loss-scaling knobs while fp16 is off,
// prescale_gradients false); the same key at a value that would change the numerics is refused.
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "longtrain/config/problems.h"

namespace lt::config {

struct PortNotes {
  std::vector<std::string> autoKeys;  // dotted paths given as "auto"
  std::vector<std::string> ignored;   // "path (why)" of each no-op DeepSpeed key
};

// Removes from `j` the "auto" values and the no-op keys (noting them), and adds a problem for
// each unimplemented feature a key turns on. What remains is for the strict parser.
PortNotes settleDeepSpeedKeys(nlohmann::json& j, Problems& problems);

// The start-up lines that report `notes`, with each "auto" key's resolved value taken from
// the effective config (`effective`: the parser's record of every key); none when empty.
std::vector<std::string> portNotices(const PortNotes& notes, const nlohmann::json& effective);

}  // namespace lt::config
