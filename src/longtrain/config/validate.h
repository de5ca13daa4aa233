// The rules that span keys or need the job's size, in one place: every entry point (train,
// plan, the launcher before it starts ranks, the tests' fuzzer) runs them through
// parseConfig, so a config one of them accepts is accepted by all (a rank never refuses,
// after launch, what `plan` or the launcher let through).
#pragma once
#include "longtrain/config/config.h"

namespace lt::config {

// Checks `c` for a job of `world` ranks and fills what derives from it: whichever of the
// three batch keys was not given (DeepSpeed's rules) and `layout`. Errors name the keys and
// the fix.
void validate(Config& c, int world);

// The layout `c`'s keys give on `world` ranks (validate() stores it in c.layout; the memory
// model and the ablation ladder ask again for configs they vary).
ParallelLayout layoutOf(const Config& c, int world);

// The head groups Ulysses pipelines its all-to-alls over under `layout` (sp/ulysses.h): the
// kv heads a rank holds after the all-to-all, max(KV / U, 1), split into G groups.
// sequence_parallel_ulysses_head_groups, or for "auto" 2 where those kv heads are even, else 1;
// always 1 where the pipeline does not run (no Ulysses, a ring, zigzag, a core other than
// model.attention "fused").
int ulyssesHeadGroups(const Config& c, const ParallelLayout& layout);

// The vocabulary the built-in kv_recall task needs: BOS, padding, keys, values, noise, and
// with fused pairs one token per (key, value).
int64_t kvRecallVocabNeeded(const DataConfig& d);
// The kv_recall task's own rules (validate() runs them on the config, KvRecallDataset on its
// options): distinct keys per sample, room for the pairs and queries.
void checkKvRecall(int64_t seqLen, int64_t pairs, int64_t queries, int64_t keys, int64_t values, int64_t noise);

}  // namespace lt::config
