// Small string helpers shared by the error messages of several modules.
#pragma once
#include <string>
#include <vector>

namespace lt {

// Levenshtein distance.
size_t editDistance(const std::string& a, const std::string& b);
// The candidate closest to `name` by edit distance ("" when there is none): the
// "did you mean" of config keys and pass names.
std::string closestName(const std::string& name, const std::vector<std::string>& candidates);
// The first line of an exception message (c10 errors append a backtrace).
std::string firstLine(const std::string& s);

}  // namespace lt
