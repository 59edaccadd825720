// `cortado launch --nproc N [--nnodes M --node-rank R --master HOST:PORT] -- CMD...`: starts N
// local ranks of CMD with the Cortado environment set (CORTADO_RANK, CORTADO_WORLD_SIZE, ...,
// CORTADO_JOB_TOKEN), prefixes their output with "[rank] ", forwards SIGINT/SIGTERM, and when one
// rank fails stops the rest and exits with its code. The launcher itself lives in
// distributed/ (cortado/dist/launcher.h) so other programs can use it too.
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "cortado/dist/env.h"
#include "cortado/dist/launcher.h"
#include "tools/commands.h"

namespace cortado::tools {
namespace {

// `cortado launch ... -- cortado train ...` should run this very binary even when `cortado` is
// not on PATH.
std::string ResolveSelf(const std::string& program) {
  if (program != "cortado") return program;
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    size_t start = 0;
    while (start <= dirs.size()) {
      size_t end = dirs.find(':', start);
      if (end == std::string::npos) end = dirs.size();
      std::string candidate = dirs.substr(start, end - start) + "/cortado";
      if (end > start && ::access(candidate.c_str(), X_OK) == 0) return program;
      start = end + 1;
    }
  }
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return program;
  return std::string(buf, static_cast<size_t>(n));
}

}  // namespace

void AddLaunchCommand(CLI::App& app) {
  struct Args {
    int nproc = 1;
    int nnodes = 1;
    int node_rank = 0;
    std::string master;
    bool no_prefix = false;
    double grace_s = 5.0;
    std::vector<std::string> command;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Start N local ranks of a command with the Cortado environment set");
  cmd->add_option("--nproc,-n", args->nproc, "Ranks on this node")->check(CLI::PositiveNumber);
  cmd->add_option("--nnodes", args->nnodes, "Nodes in the job (one launcher per node)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--node-rank", args->node_rank, "This node's index, 0..nnodes-1")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--master", args->master,
                  "HOST:PORT of rank 0's store (required with --nnodes > 1; node 0 binds it)");
  cmd->add_flag("--no-prefix", args->no_prefix, "Do not prefix output lines with [rank]");
  cmd->add_option(
      "--grace", args->grace_s,
      "Seconds between SIGTERM and SIGKILL when stopping ranks (CORTADO_LAUNCH_GRACE_S)");
  // Put the command after --, so its own options are not taken for the launcher's.
  cmd->add_option("command", args->command, "The command to run, after --")->required();
  cmd->footer(
      "Usage: cortado launch [OPTIONS] -- CMD [ARGS...]   (-- keeps CMD's options its own)\n"
      "Example: cortado launch --nproc 2 -- cortado bench comm --sizes 4K:64M\n"
      "Every rank gets CORTADO_RANK, CORTADO_WORLD_SIZE, CORTADO_LOCAL_RANK,\n"
      "CORTADO_LOCAL_WORLD_SIZE, CORTADO_NODE_RANK, CORTADO_MASTER_ADDR, CORTADO_MASTER_PORT and\n"
      "CORTADO_JOB_TOKEN (kept from the environment when set, else random).");
  cmd->callback([args, cmd] {
    dist::LauncherOptions o;
    o.nproc = args->nproc;
    o.nnodes = args->nnodes;
    o.node_rank = args->node_rank;
    o.master = args->master;
    o.prefix_output = !args->no_prefix;
    double grace = args->grace_s;
    if (cmd->count("--grace") == 0) {
      if (const char* g = std::getenv("CORTADO_LAUNCH_GRACE_S")) grace = std::atof(g);
    }
    o.grace = std::chrono::milliseconds(static_cast<int64_t>(grace * 1000.0));
    o.command = args->command;
    o.command[0] = ResolveSelf(o.command[0]);
    SetExitCode(dist::RunLauncher(o));
  });
}

}  // namespace cortado::tools
