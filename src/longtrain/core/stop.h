// Preemption-safe stops: SIGTERM (how Slurm and Kubernetes preempt) and SIGINT only raise a
// flag; the training loop agrees on it across ranks at the end of each step, checkpoints and
// exits 128 + signal. Non-obvious: a second signal exits at once only when it comes more than
// a second after the first, because a rank may get the same request twice (from its launcher,
// and from a scheduler that signals every process of the job).
#pragma once

namespace lt {

// `checkpointing`: a stop saves a checkpoint (train.checkpoint.dir is set), as the line the
// first signal prints says; `speak`: this process prints it (one process of a node, so a
// signal forwarded to every rank is announced once).
void installStopHandlers(bool checkpointing, bool speak);
int stopSignal();  // 0, or the first SIGTERM / SIGINT received

}  // namespace lt
