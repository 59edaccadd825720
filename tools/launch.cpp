// `cortado launch --nproc N [--nnodes M --node-rank R --master HOST:PORT] -- CMD...`: starts N
// local ranks of CMD with the Cortado environment set (CORTADO_RANK, CORTADO_WORLD_SIZE, ...,
// CORTADO_JOB_TOKEN), prefixes their output with "[rank] ", forwards SIGINT/SIGTERM, and when one
// rank fails stops the rest and exits with its code (after a signal: 128 + the signal, as the
// ranks do). --nproc-per-node is torchrun's spelling of --nproc. The launcher itself lives in
// distributed/ (cortado/dist/launcher.h) so other programs can use it too.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cortado/dist/env.h"
#include "cortado/dist/error.h"
#include "cortado/dist/launcher.h"
#include "engine/base/env.h"
#include "engine/base/error.h"
#include "tools/command_line.h"
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

// The master the ranks meet at when --master is not given: CORTADO_MASTER_ADDR/PORT, else
// torchrun's MASTER_ADDR/PORT, as the ranks themselves would read them (cortado/dist/env.h).
// The launcher binds that port, so a port in use fails here at once instead of leaving the
// ranks to wait for a store that never answers. *from names the variable; "" when none is set.
std::string MasterFromEnv(std::string* from) {
  const char* port_var = std::getenv("CORTADO_MASTER_PORT") ? "CORTADO_MASTER_PORT"
                         : std::getenv("MASTER_PORT")       ? "MASTER_PORT"
                                                            : nullptr;
  if (port_var == nullptr || *std::getenv(port_var) == '\0') return "";
  const char* addr = std::getenv("CORTADO_MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') addr = std::getenv("MASTER_ADDR");
  *from = port_var;
  return StrCat(addr != nullptr && *addr != '\0' ? addr : "127.0.0.1", ":", std::getenv(port_var));
}

// Whether `program` can be run: a path that is executable, or a name found on PATH.
bool Runnable(const std::string& program) {
  if (program.find('/') != std::string::npos) return ::access(program.c_str(), X_OK) == 0;
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    const std::string dir = end > start ? dirs.substr(start, end - start) : ".";
    if (::access((dir + "/" + program).c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

struct LaunchArgs {
  int nproc = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master;
  bool no_prefix = false;
  double grace_s = 5.0;
  std::vector<std::string> command;
};

// Checks the options, prepares the ranks' environment and runs them; grace_given: whether
// --grace was on the command line (else CORTADO_LAUNCH_GRACE_S may set it).
void RunLaunch(const LaunchArgs& args, bool grace_given) {
  dist::LauncherOptions o;
  o.nproc = args.nproc;
  o.nnodes = args.nnodes;
  o.node_rank = args.node_rank;
  o.master = args.master;
  o.prefix_output = !args.no_prefix;
  if (o.node_rank >= o.nnodes) {
    UsageFail("--node-rank must be in 0..", o.nnodes - 1, " (--nnodes ", o.nnodes, "), got ",
              o.node_rank);
  }
  std::string master_from = "--master";
  if (o.master.empty()) o.master = MasterFromEnv(&master_from);
  if (!o.master.empty()) {
    const size_t colon = o.master.rfind(':');
    int port = 0;
    try {
      port = colon == std::string::npos ? 0 : std::stoi(o.master.substr(colon + 1));
    } catch (const std::exception&) {
      port = 0;
    }
    if (port <= 0 || port > 65535) {
      UsageFail(master_from, " '", o.master, "': expected HOST:PORT with a port in 1..65535");
    }
  } else if (o.nnodes > 1) {
    UsageFail("--master HOST:PORT is required with --nnodes > 1");
  }
  double grace = args.grace_s;
  if (!grace_given) grace = EnvDouble("CORTADO_LAUNCH_GRACE_S", grace, 0, 1e6);
  o.grace = std::chrono::milliseconds(static_cast<int64_t>(grace * 1000.0));
  o.command = args.command;
  o.command[0] = ResolveSelf(o.command[0]);
  CORTADO_CHECK(Runnable(o.command[0]), "cannot run '", args.command[0],
                "': not an executable file, nor a program on PATH");
  // The launcher adds these for each rank; a value inherited from an outer job would come
  // first in the rank's environment and win.
  for (const char* name :
       {"CORTADO_RANK", "CORTADO_WORLD_SIZE", "CORTADO_LOCAL_RANK", "CORTADO_LOCAL_WORLD_SIZE",
        "CORTADO_NODE_RANK", "CORTADO_MASTER_ADDR", "CORTADO_MASTER_PORT", "CORTADO_STORE_FD"}) {
    ::unsetenv(name);
  }
  // This command up to its `--`: a stopped training prints it before its own command line
  // (tools/command_line.h, ResumeCommand).
  const std::vector<std::string>& argv = CommandLine();
  std::vector<std::string> launch(
      argv.begin(),
      argv.end() - static_cast<std::ptrdiff_t>(std::min(argv.size(), args.command.size())));
  if (launch.empty() || launch.back() != "--") launch.push_back("--");
  ::setenv("CORTADO_LAUNCH_COMMAND", ShellJoin(launch).c_str(), 1);
  try {
    SetExitCode(dist::RunLauncher(o));
  } catch (const dist::Error& e) {
    const std::string what = e.what();
    // Binding the master port is the launcher's first act: name where the port came from.
    if (what.find("cannot listen on") != std::string::npos && master_from != "--master") {
      Fail(what, " (the master port comes from ", master_from,
           "; choose a free port, or unset it to let cortado launch pick one)");
    }
    if (what.rfind("launch: ", 0) == 0) Fail(what.substr(8));
    throw;
  }
}

}  // namespace

void AddLaunchCommand(CLI::App& app) {
  auto args = std::make_shared<LaunchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "launch", "Start N local ranks of a command with the Cortado environment set");
  // torchrun spells it --nproc-per-node (and --nproc_per_node).
  cmd->add_option("--nproc,-n,--nproc-per-node,--nproc_per_node", args->nproc, "Ranks on this node")
      ->check(IntAtLeast(1));
  cmd->add_option("--nnodes", args->nnodes, "Nodes in the job (one launcher per node)")
      ->check(IntAtLeast(1));
  cmd->add_option("--node-rank,--node_rank", args->node_rank, "This node's index, 0..nnodes-1")
      ->check(IntAtLeast(0));
  cmd->add_option("--master", args->master,
                  "HOST:PORT of rank 0's store (required with --nnodes > 1; node 0 binds it). "
                  "Default: CORTADO_MASTER_ADDR/PORT or MASTER_ADDR/PORT when set, else "
                  "127.0.0.1 and a free port");
  cmd->add_flag("--no-prefix", args->no_prefix, "Do not prefix output lines with [rank]");
  cmd->add_option(
         "--grace", args->grace_s,
         "Seconds between SIGTERM and SIGKILL when stopping ranks (CORTADO_LAUNCH_GRACE_S)")
      ->check(NumberAtLeast(0));
  // Put the command after --, so its own options are not taken for the launcher's.
  cmd->add_option("command", args->command, "The command to run, after --")->required();
  cmd->footer(
      "Usage: cortado launch [OPTIONS] -- CMD [ARGS...]   (-- keeps CMD's options its own)\n"
      "Example: cortado launch --nproc 2 -- cortado bench comm --sizes 4K:64M\n"
      "Every rank gets CORTADO_RANK, CORTADO_WORLD_SIZE, CORTADO_LOCAL_RANK,\n"
      "CORTADO_LOCAL_WORLD_SIZE, CORTADO_NODE_RANK, CORTADO_MASTER_ADDR, CORTADO_MASTER_PORT,\n"
      "CORTADO_JOB_TOKEN (kept from the environment when set, else random) and\n"
      "CORTADO_LAUNCH_COMMAND (this launch command up to --, for the resume hint of train).\n"
      "Exit code: the first failing rank's, or 128 + the signal the launcher received.");
  cmd->callback([args, cmd] { RunLaunch(*args, cmd->count("--grace") > 0); });
}

}  // namespace cortado::tools
