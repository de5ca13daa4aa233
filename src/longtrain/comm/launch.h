// The launcher behind `longtrain train --nproc K` and `--nnodes N --node-rank R ...`, with
// torchrun's contract: each node's launcher starts K ranks that re-run this executable with
// RANK (= R*K + local rank), WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR
// and MASTER_PORT set.
// - One node: the ranks rendezvous through a file (c10d FileStore, LONGTRAIN_STORE_FILE), so
//   nothing listens on any network; Gloo binds loopback.
// - Several nodes: node 0's launcher hosts the TCPStore on MASTER_PORT for the whole job,
//   across restarts (torchrun's agent store); each attempt's ranks use their own key prefix
//   (LONGTRAIN_STORE_PREFIX). A node must present the job id (--rdzv-id) node 0 holds.
//   Like torchrun's agent, a node retries node 0's store until rdzvTimeout, at start (nodes
//   start in any order) and after a failure; one that loses the store mid-run leaves its ranks
//   running and reconnects at the next rendezvous, so a partition ends in a restart, not an exit.
// Failure: the first rank that fails, on any node, is the report; the others get `grace` to
// fail on their own (they will, by collective timeout, each naming what it saw), then are
// killed. With maxRestarts, every node's launcher then tears down and re-rendezvouses, and
// the ranks resume from the newest complete checkpoint of the run (LONGTRAIN_RUN_ID, one id
// for every attempt and node; LONGTRAIN_RESTART_ATTEMPT counts from 0).
// SIGTERM / SIGINT: forwarded once to every local rank, which finish the step, checkpoint and
// exit 128 + signal; the launcher exits the same way, without restarting. A second signal
// kills the ranks at once. Children die with the launcher (PR_SET_PDEATHSIG).
#pragma once
#include <chrono>
#include <functional>
#include <string>
#include <vector>

namespace lt::comm {

struct LaunchOptions {
  int nprocPerNode = 1;
  int nnodes = 1, nodeRank = 0;
  std::string masterAddr;  // several nodes: node 0's address; "": a one-node job
  int masterPort = 0;      // several nodes: the port of node 0's store
  std::string rdzvId;      // the job's id: every node must present node 0's (torchrun --rdzv-id)
  std::chrono::milliseconds grace{60000};
  std::chrono::milliseconds rdzvTimeout{900000};  // waiting for node 0's store and the other nodes, each attempt
  int maxRestarts = 0;
  // Several nodes: node 0 calls this once, before the first attempt, with the link between nodes
  // in seconds per byte (`measureLink`: node 1 times sending through node 0's store; else 0), and
  // every node's ranks get the arguments it returns appended (train --fit: node 0's choice is the
  // job's, so nodes whose rates differ cannot choose differently). Null: nothing to agree on. A
  // node whose null-ness differs from node 0's is refused on both, within --rdzv-timeout.
  std::function<std::vector<std::string>(double linkSecondsPerByte)> chooseOnNodeZero;
  bool measureLink = false;
};

// argv: the full command line to run in each rank (argv[0] is replaced by this executable).
// Returns 0 when every rank of an attempt exited 0; 128 + signal after a forwarded SIGTERM or
// SIGINT; otherwise 1, after printing which rank (and node) failed first in each attempt.
int launch(const std::vector<std::string>& argv, const LaunchOptions& opts);

// A free TCP port on 127.0.0.1 (bound then released; a race with other programs is possible).
int findFreePort();

// "exited with code 3", "was killed by signal 9 (Killed; out of memory?)".
std::string describeExitStatus(int waitStatus);

}  // namespace lt::comm
