// Small string helpers shared by the error messages of several modules.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

// Levenshtein distance.
size_t editDistance(const std::string& a, const std::string& b);
// The candidate closest to `name` by edit distance, if it is a near miss (at most 2 edits, or a
// quarter of the name's length) or starts with `name`; "" otherwise: the "did you mean" of
// config keys and pass names.
std::string closestName(const std::string& name, const std::vector<std::string>& candidates);
// The first line of an exception message (c10 errors append a backtrace).
std::string firstLine(const std::string& s);
// "4GiB", "512MiB", "1.5GB", "1000000" -> bytes. Suffixes: B, KiB, MiB, GiB, TiB (powers of
// 1024), KB, MB, GB, TB (powers of 1000), K/M/G/T as the binary ones; case-insensitive.
// An unparsable or non-positive value is an lt::Error naming `what` and the value.
int64_t parseByteSize(const std::string& text, const std::string& what);
// A link's rate -> bytes per second: bits as tc and NIC data sheets write them ("10Gbit/s",
// "1gbit", "100Mbit"; k/m/g/t decimal) or bytes a second ("1.25GB/s", "100MiB/s": B, KB, MB, GB,
// KiB, MiB, GiB, with an uppercase B and the "/s"). "Gb/s" and "1GB" are refused: bits or bytes?
// An lt::Error names `what`.
double parseLinkRate(const std::string& text, const std::string& what);

}  // namespace lt
