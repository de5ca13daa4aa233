// One job identity: at rendezvous every rank publishes what must agree across the job (its
// effective config, flattened to dotted keys, the world layout, a digest of its binary) and
// where it runs; every rank then reads every other's and compares, so a job whose ranks
// disagree stops on every rank before the first collective, each naming the differing keys
// and which ranks hold which value. Non-obvious: the first thing a rank does is claim its
// rank number in the store (an atomic add); a second claimant is a rank of another job that
// shares the store's port, and it stops there, before it has written anything the first job reads.
#pragma once
#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace lt::comm {

struct RankIdentity {
  std::map<std::string, std::string> agreed;  // must be equal on every rank
  std::string host;                           // where this rank runs (for diagnoses)
};

// Returns every rank's host, by world rank. Throws lt::Error on a disagreement, a rank number
// claimed twice, or ranks that do not publish within `timeout`.
std::vector<std::string> exchangeIdentity(c10d::Store& store, int rank, int size, const RankIdentity& mine,
                                          std::chrono::milliseconds timeout, const std::string& storeWhere);

// The differing keys of `ids` (by rank), each as "key: ranks 0-1 = a; ranks 2 = b" lines.
std::string describeDisagreement(const std::vector<std::map<std::string, std::string>>& ids);

// This executable's bytes, digested (CRC-32C of /proc/self/exe, hex): two builds differ.
std::string binaryDigest();

}  // namespace lt::comm
