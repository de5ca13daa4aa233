// Local launcher for `longtrain train --nproc N`, like `torchrun --standalone`: N child
// processes re-run this executable with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
// MASTER_ADDR and MASTER_PORT set. If a child fails, the others get `grace` to fail on
// their own (they will, by collective timeout), then are killed; the launcher's return code
// is non-zero and its message names the first rank that failed. Children die with the
// launcher (PR_SET_PDEATHSIG), so no orphan is left behind.
// With maxRestarts = N (torchrun's --max-restarts), a failed job is started again, whole, up
// to N times; children see LONGTRAIN_RESTART_ATTEMPT (0 first) and LONGTRAIN_RUN_ID (one
// random id per launch), and resume from the newest complete checkpoint of that launch.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace lt::comm {

struct LaunchOptions {
  int nproc = 1;
  std::chrono::milliseconds grace{60000};
  int maxRestarts = 0;
};

// argv: the full command line to run in each child (argv[0] is replaced by this executable).
// Returns 0 when every rank of some attempt exited 0; otherwise 1, after printing which rank
// failed first in each attempt.
int launchLocal(const std::vector<std::string>& argv, const LaunchOptions& opts);

// A free TCP port on 127.0.0.1 (bound then released; a race with other programs is possible).
int findFreePort();

}  // namespace lt::comm
