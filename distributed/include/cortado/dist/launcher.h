// The local launcher behind `cortado launch`: starts N ranks of a command on this node with the
// Cortado environment set (see env.h), prefixes each output line with "[rank] ", forwards SIGINT,
// SIGTERM and SIGHUP (then waits for the ranks, which may save a checkpoint first; a second
// signal kills them), and when one rank fails stops the others (SIGTERM, then SIGKILL after a
// grace period) and returns that rank's exit code (128 + signal when killed by a signal).
//
// Single node: the launcher binds rank 0's store socket on 127.0.0.1 and hands it to rank 0
// (CORTADO_STORE_FD), so no port can be stolen between choosing and binding it. Several nodes:
// run one launcher per node with the same --nnodes, --master HOST:PORT and CORTADO_JOB_TOKEN
// (or a Slurm/PMIx job identity); node 0 binds the master port.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace cortado::dist {

struct LauncherOptions {
  int nproc = 1;  // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  std::string master;  // "HOST:PORT"; required when nnodes > 1
  std::vector<std::string> command;
  bool prefix_output = true;
  std::chrono::milliseconds grace{5000};  // CORTADO_LAUNCH_GRACE_S: SIGTERM -> SIGKILL
  int stdout_fd = 1;                      // where the prefixed output goes
  int stderr_fd = 2;
};

// Runs the ranks to completion; returns the exit code. Throws cortado::dist::Error (kConfig)
// for bad options, before starting anything.
int RunLauncher(const LauncherOptions& options);

}  // namespace cortado::dist
