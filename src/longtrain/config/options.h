// The config's closed sets of choices as enums, each with the one table of the names a config
// file spells it by. The parser turns a name into its enum once (JsonReader::getOption); every
// other module compares enums, never strings. Non-obvious: a table lists every name the enum
// prints as, including ones a key does not accept (scheduler "" is the absent section), so
// `optionName` is total and the effective config prints what the user would write.
#pragma once
#include <array>
#include <cstddef>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

namespace lt::config {

enum class OptimizerType { AdamW, Adam };
enum class SchedulerType { Constant, WarmupLR, WarmupDecayLR, WarmupCosineLR };
enum class WarmupType { Log, Linear };
enum class OffloadDevice { None, Cpu };
enum class DataType { KvRecall, Uint16, Uint32, Bytes };
enum class TokenDtype { FromSidecar, Uint16, Uint32 };  // train.eval.dtype: "" reads the sidecar's
enum class Packing { None, Documents };
enum class OnSaveError { Stop, Warn };
enum class CommDtype { Fp32, Bf16 };
enum class SpBalance { Auto, Contiguous, Zigzag };
enum class Recompute { Auto, All, None };  // activation_checkpointing
enum class RopeType { None, Linear, Llama3, Yarn };
enum class AttentionKernel { Fused, Chunked, Naive };
enum class GemmChoice { Auto, Blas, OneDnn };
enum class ModelType { Llama, Qwen2, Qwen3, Mistral };

template <class E>
struct OptionNames;  // specialised below: `static constexpr std::array<std::pair<E, const char*>, N> kAll`

#define LT_OPTION_NAMES(E, ...)                                           \
  template <>                                                             \
  struct OptionNames<E> {                                                 \
    static constexpr std::pair<E, const char*> kAll[] = {__VA_ARGS__}; \
  }

LT_OPTION_NAMES(OptimizerType, {OptimizerType::AdamW, "AdamW"}, {OptimizerType::Adam, "Adam"});
LT_OPTION_NAMES(SchedulerType, {SchedulerType::Constant, ""}, {SchedulerType::WarmupLR, "WarmupLR"},
                {SchedulerType::WarmupDecayLR, "WarmupDecayLR"}, {SchedulerType::WarmupCosineLR, "WarmupCosineLR"});
LT_OPTION_NAMES(WarmupType, {WarmupType::Log, "log"}, {WarmupType::Linear, "linear"});
LT_OPTION_NAMES(OffloadDevice, {OffloadDevice::None, "none"}, {OffloadDevice::Cpu, "cpu"});
LT_OPTION_NAMES(DataType, {DataType::KvRecall, "kv_recall"}, {DataType::Uint16, "uint16"},
                {DataType::Uint32, "uint32"}, {DataType::Bytes, "bytes"});
LT_OPTION_NAMES(TokenDtype, {TokenDtype::FromSidecar, ""}, {TokenDtype::Uint16, "uint16"},
                {TokenDtype::Uint32, "uint32"});
LT_OPTION_NAMES(Packing, {Packing::None, "none"}, {Packing::Documents, "documents"});
LT_OPTION_NAMES(OnSaveError, {OnSaveError::Stop, "stop"}, {OnSaveError::Warn, "warn"});
LT_OPTION_NAMES(CommDtype, {CommDtype::Fp32, "fp32"}, {CommDtype::Bf16, "bf16"});
LT_OPTION_NAMES(SpBalance, {SpBalance::Auto, "auto"}, {SpBalance::Contiguous, "contiguous"},
                {SpBalance::Zigzag, "zigzag"});
LT_OPTION_NAMES(Recompute, {Recompute::Auto, "auto"}, {Recompute::All, "all"}, {Recompute::None, "none"});
LT_OPTION_NAMES(RopeType, {RopeType::None, "none"}, {RopeType::Linear, "linear"}, {RopeType::Llama3, "llama3"},
                {RopeType::Yarn, "yarn"});
LT_OPTION_NAMES(AttentionKernel, {AttentionKernel::Fused, "fused"}, {AttentionKernel::Chunked, "chunked"},
                {AttentionKernel::Naive, "naive"});
LT_OPTION_NAMES(GemmChoice, {GemmChoice::Auto, "auto"}, {GemmChoice::Blas, "blas"}, {GemmChoice::OneDnn, "onednn"});
LT_OPTION_NAMES(ModelType, {ModelType::Llama, "llama"}, {ModelType::Qwen2, "qwen2"}, {ModelType::Qwen3, "qwen3"},
                {ModelType::Mistral, "mistral"});
#undef LT_OPTION_NAMES

template <class E>
const char* optionName(E e) {
  for (const auto& [value, name] : OptionNames<E>::kAll)
    if (value == e) return name;
  return "?";  // unreachable: every enumerator has a row
}

template <class E>
std::optional<E> optionFromName(std::string_view s) {
  for (const auto& [value, name] : OptionNames<E>::kAll)
    if (s == name) return value;
  return std::nullopt;
}

// Messages stream an option as the name the user wrote.
template <class E, class = decltype(OptionNames<E>::kAll)>
std::ostream& operator<<(std::ostream& os, E e) {
  return os << optionName(e);
}

}  // namespace lt::config
