// The per-machine records' files (peak_record.h's GEMM peaks, process_baseline.h's baselines):
// JSON objects in peakRecordDir(). Non-obvious: written to a temporary file and renamed over the
// old one, so processes of one host updating a record at once never leave it half-written.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>

namespace lt::train {

// The record in `file`; an empty object where it is missing or damaged (started afresh).
nlohmann::json readRecord(const std::filesystem::path& file);
// Writes `j` to `file` (creating its directory); false where that is not possible.
bool writeRecord(const std::filesystem::path& file, const nlohmann::json& j);

}  // namespace lt::train
