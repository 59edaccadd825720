// The local launcher (see launcher.h), in three parts: PlanLaunch checks the options and works
// out what every rank gets (world size, master, job token, rank 0's store socket); SpawnRank
// starts one rank; the Supervisor watches them, one poll per Tick over the ranks' output pipes and
// a signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP), so output, exits and signals are handled in
// order without races. Each rank runs in its own process group, which the launcher signals as a
// whole; PR_SET_PDEATHSIG makes ranks exit if the launcher itself is killed.
#include "cortado/dist/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/socket.h"
#include "cortado/dist/env.h"
#include "cortado/dist/error.h"

extern char** environ;

namespace cortado::dist {
namespace {

using internal::Fd;

std::string RandomToken() {
  std::random_device rd;
  char buf[33];
  for (int i = 0; i < 4; ++i) {
    std::snprintf(buf + 8 * i, 9, "%08x", static_cast<unsigned>(rd()));
  }
  return buf;
}

void WriteAllFd(int fd, const std::string& s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    p += n;
    left -= static_cast<size_t>(n);
  }
}

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int code = 0;
  Fd out, err;  // read ends of the pipes
  std::string out_partial, err_partial;
};

// Emits complete lines from `partial` (and all of it when flush), prefixed.
void EmitLines(std::string* partial, const std::string& prefix, int fd, bool flush) {
  size_t start = 0;
  std::string out;
  for (;;) {
    size_t nl = partial->find('\n', start);
    if (nl == std::string::npos) break;
    out += prefix;
    out.append(*partial, start, nl + 1 - start);
    start = nl + 1;
  }
  partial->erase(0, start);
  if (flush && !partial->empty()) {
    out += prefix + *partial + "\n";
    partial->clear();
  }
  if (!out.empty()) WriteAllFd(fd, out);
}

// What the ranks of this node are told (their environment), worked out before any starts.
struct LaunchPlan {
  int world = 0;
  std::string master_host = "127.0.0.1";
  int master_port = 0;
  std::string token;
  Fd store;  // rank 0's store socket, on node 0: bound here, handed over
};

// "HOST:PORT" of --master into the plan; throws kConfig naming the option.
void ParseMaster(const std::string& master, LaunchPlan* plan) {
  size_t colon = master.rfind(':');
  if (colon == std::string::npos) {
    Fail(ErrorKind::kConfig, "launch: --master '", master, "' is not HOST:PORT");
  }
  plan->master_host = master.substr(0, colon);
  try {
    plan->master_port = std::stoi(master.substr(colon + 1));
  } catch (const std::exception&) {
    plan->master_port = -1;
  }
  if (plan->master_port <= 0 || plan->master_port > 65535) {
    Fail(ErrorKind::kConfig, "launch: --master '", master, "' has no valid port");
  }
}

// Checks the options (throwing kConfig before anything starts) and makes the plan.
LaunchPlan PlanLaunch(const LauncherOptions& o) {
  if (o.command.empty()) Fail(ErrorKind::kConfig, "launch: no command to run (use -- CMD ...)");
  if (o.nproc < 1) Fail(ErrorKind::kConfig, "launch: --nproc must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes) {
    Fail(ErrorKind::kConfig, "launch: --node-rank ", o.node_rank, " is outside --nnodes ",
         o.nnodes);
  }
  LaunchPlan plan;
  plan.world = o.nproc * o.nnodes;
  if (!o.master.empty()) {
    ParseMaster(o.master, &plan);
  } else if (o.nnodes > 1) {
    Fail(ErrorKind::kConfig, "launch: --master HOST:PORT is required with --nnodes > 1");
  }
  if (auto t = FindJobToken()) {
    plan.token = *t;
  } else if (o.nnodes > 1) {
    Fail(ErrorKind::kConfig,
         "launch: several nodes need a shared job token: set CORTADO_JOB_TOKEN to the same value "
         "on every node");
  } else {
    plan.token = RandomToken();
  }
  // Rank 0's store socket: bound here, handed over, so no other process can take the port.
  if (o.node_rank == 0) {
    plan.store = internal::ListenTcp(o.nnodes > 1 ? "0.0.0.0" : plan.master_host, plan.master_port,
                                     std::max(128, plan.world));
    plan.master_port = internal::LocalPort(plan.store.get());
  }
  return plan;
}

// The launcher's signals, blocked and read from a signalfd for as long as it lives (the mask is
// restored after); children get the default mask and handlers back.
class SignalChannel {
 public:
  SignalChannel() {
    sigset_t mask;
    sigemptyset(&mask);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&mask, s);
    if (sigprocmask(SIG_BLOCK, &mask, &old_mask_) != 0) {
      Fail(ErrorKind::kSystem, "sigprocmask: ", internal::ErrnoText(errno));
    }
    fd_.Reset(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
    if (!fd_) {
      const int err = errno;
      sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
      Fail(ErrorKind::kSystem, "signalfd: ", internal::ErrnoText(err));
    }
  }
  ~SignalChannel() { sigprocmask(SIG_SETMASK, &old_mask_, nullptr); }
  SignalChannel(const SignalChannel&) = delete;
  SignalChannel& operator=(const SignalChannel&) = delete;

  int fd() const { return fd_.get(); }
  const sigset_t& old_mask() const { return old_mask_; }
  // The next signal that arrived, or 0 when none is pending.
  int Next() {
    signalfd_siginfo info;
    if (::read(fd_.get(), &info, sizeof(info)) != sizeof(info)) return 0;
    return static_cast<int>(info.ssi_signo);
  }

 private:
  sigset_t old_mask_;
  Fd fd_;
};

// The environment of rank `local` of this node: the launcher's, with the Cortado variables.
std::vector<std::string> RankEnvironment(const LauncherOptions& o, const LaunchPlan& plan,
                                         int local) {
  const int rank = o.node_rank * o.nproc + local;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("CORTADO_STORE_FD=", 0) == 0) continue;
    env.push_back(kv);
  }
  env.push_back("CORTADO_RANK=" + std::to_string(rank));
  env.push_back("CORTADO_WORLD_SIZE=" + std::to_string(plan.world));
  env.push_back("CORTADO_LOCAL_RANK=" + std::to_string(local));
  env.push_back("CORTADO_LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
  env.push_back("CORTADO_NODE_RANK=" + std::to_string(o.node_rank));
  env.push_back("CORTADO_MASTER_ADDR=" + plan.master_host);
  env.push_back("CORTADO_MASTER_PORT=" + std::to_string(plan.master_port));
  env.push_back("CORTADO_JOB_TOKEN=" + plan.token);
  if (rank == 0 && plan.store) {
    env.push_back("CORTADO_STORE_FD=" + std::to_string(plan.store.get()));
  }
  return env;
}

std::vector<char*> Pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Starts rank `local` of this node: its own process group, output through pipes, the plan's
// environment. Throws kSystem when a pipe or the fork fails.
Rank SpawnRank(const LauncherOptions& o, const LaunchPlan& plan, int local,
               const sigset_t& child_mask) {
  Rank r;
  r.rank = o.node_rank * o.nproc + local;
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0)
    Fail(ErrorKind::kSystem, "pipe: ", internal::ErrnoText(errno));
  r.out.Reset(out_pipe[0]);
  Fd out_write(out_pipe[1]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0)
    Fail(ErrorKind::kSystem, "pipe: ", internal::ErrnoText(errno));
  r.err.Reset(err_pipe[0]);
  Fd err_write(err_pipe[1]);
  std::vector<std::string> argv_store = o.command;
  std::vector<char*> argv = Pointers(argv_store);
  std::vector<std::string> env = RankEnvironment(o, plan, local);
  std::vector<char*> envp = Pointers(env);
  const pid_t launcher_pid = ::getpid();

  const pid_t pid = ::fork();
  if (pid < 0) Fail(ErrorKind::kSystem, "fork: ", internal::ErrnoText(errno));
  if (pid == 0) {
    // Child: own process group, die with the launcher, default signals, pipes as stdio.
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != launcher_pid) ::_exit(128 + SIGTERM);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(s, SIG_DFL);
    ::sigprocmask(SIG_SETMASK, &child_mask, nullptr);
    ::dup2(out_write.get(), 1);
    ::dup2(err_write.get(), 2);
    if (r.rank == 0 && plan.store) {
      int flags = ::fcntl(plan.store.get(), F_GETFD);
      ::fcntl(plan.store.get(), F_SETFD, flags & ~FD_CLOEXEC);
    }
    ::execvpe(argv[0], argv.data(), envp.data());
    std::string msg =
        "cortado launch: cannot run '" + argv_store[0] + "': " + internal::ErrnoText(errno) + "\n";
    WriteAllFd(2, msg);
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here, so kill(-pid) works even before the child runs
  r.pid = pid;
  return r;  // the write ends close here: the child has its copies
}

// Watches the ranks until they have all exited and their output is drained: one poll per Tick
// over the signals and the ranks' output pipes, then output, signals and exits in that order.
//   - output is copied line by line, each line prefixed with "[rank] " (LauncherOptions);
//   - the first rank to fail sets the result to its exit code and stops the others: SIGTERM,
//     then SIGKILL after the grace period;
//   - a signal the user sends (SIGINT, SIGTERM, SIGHUP) is forwarded with no such timer, as the
//     ranks may need a while to finish a step and save a checkpoint, and sets the result to
//     128 + signal; a second signal while stopping kills them at once (ForwardSignals).
class Supervisor {
 public:
  Supervisor(const LauncherOptions& options, SignalChannel* signals)
      : o_(options), signals_(signals) {}

  void Add(Rank rank) { ranks_.push_back(std::move(rank)); }
  bool Done() const { return poll_failed_ || (!AnyRunning() && !AnyPipeOpen()); }
  void Tick();
  int result() const { return result_; }
  void KillAll(int sig) {
    for (auto& r : ranks_) {
      if (r.pid > 0 && !r.exited) ::kill(-r.pid, sig);
    }
  }

 private:
  struct Pipe {
    Rank* rank;
    bool is_out;  // stdout, else stderr
  };

  bool AnyRunning() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return !r.exited; });
  }
  bool AnyPipeOpen() const {
    return std::any_of(ranks_.begin(), ranks_.end(), [](const Rank& r) { return r.out || r.err; });
  }
  void PumpOutput(const Pipe& pipe);
  void ForwardSignals();
  void ReapExited();
  void BeginStop(int sig, bool with_grace);

  const LauncherOptions& o_;
  SignalChannel* signals_;
  std::vector<Rank> ranks_;
  int result_ = 0;
  int first_failed_ = -1;
  bool stopping_ = false;
  bool poll_failed_ = false;
  Deadline kill_at_ = Deadline::Never();  // SIGKILL for ranks stopped after a failure
};

void Supervisor::Tick() {
  std::vector<pollfd> fds{{signals_->fd(), POLLIN, 0}};
  std::vector<Pipe> pipes;  // per pollfd after the first
  for (auto& r : ranks_) {
    if (r.out) {
      fds.push_back({r.out.get(), POLLIN, 0});
      pipes.push_back({&r, true});
    }
    if (r.err) {
      fds.push_back({r.err.get(), POLLIN, 0});
      pipes.push_back({&r, false});
    }
  }
  const int timeout = stopping_ ? kill_at_.RemainingMs(1000) : (AnyRunning() ? -1 : 1000);
  const int n = ::poll(fds.data(), fds.size(), timeout);
  if (n < 0 && errno != EINTR) {
    poll_failed_ = true;
    return;
  }
  if (stopping_ && kill_at_.Expired()) {
    KillAll(SIGKILL);
    kill_at_ = Deadline::Never();
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents) PumpOutput(pipes[i - 1]);
  }
  if (fds[0].revents) ForwardSignals();
  ReapExited();
}

void Supervisor::PumpOutput(const Pipe& pipe) {
  Rank& r = *pipe.rank;
  Fd& fd = pipe.is_out ? r.out : r.err;
  std::string& partial = pipe.is_out ? r.out_partial : r.err_partial;
  const std::string prefix = o_.prefix_output ? StrCat("[", r.rank, "] ") : std::string();
  const int to = pipe.is_out ? o_.stdout_fd : o_.stderr_fd;
  char buf[65536];
  const ssize_t got = ::read(fd.get(), buf, sizeof(buf));
  if (got > 0) {
    partial.append(buf, static_cast<size_t>(got));
    EmitLines(&partial, prefix, to, false);
  } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
    EmitLines(&partial, prefix, to, true);
    fd.Reset();
  }
}

void Supervisor::ForwardSignals() {
  for (int sig = signals_->Next(); sig != 0; sig = signals_->Next()) {
    if (sig == SIGCHLD) continue;  // exits are reaped by ReapExited
    if (result_ == 0) result_ = 128 + sig;
    // Said on the terminal because what a second Ctrl-C costs is not obvious: the ranks'
    // stop (finish the step or abandon an evaluation at its next batch, then checkpoint) can
    // take a while, and a kill loses what no checkpoint holds yet.
    const std::string name = sig == SIGINT    ? "SIGINT"
                             : sig == SIGTERM ? "SIGTERM"
                                              : std::string("signal ") + std::to_string(sig);
    if (stopping_) {
      WriteAllFd(o_.stderr_fd,
                 "cortado launch: a second " + name +
                     ": killing the ranks now; what they did after their last checkpoint is "
                     "lost (training's end is checkpointed before its final evaluation, so a "
                     "kill during that evaluation abandons only the evaluation)\n");
      KillAll(SIGKILL);
    } else {
      WriteAllFd(o_.stderr_fd,
                 "cortado launch: " + name +
                     " forwarded to the ranks: each finishes its step (or abandons an "
                     "evaluation at its next batch), writes a checkpoint and stops; a second " +
                     name + " kills them at once\n");
      BeginStop(sig, false);
    }
  }
}

void Supervisor::ReapExited() {
  for (auto& r : ranks_) {
    if (r.exited) continue;
    // Peek without reaping: while the zombie holds its pid, its process group id cannot be
    // reused, so helpers it left behind in the group can be killed safely.
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(r.pid), &si, WEXITED | WNOHANG | WNOWAIT) != 0 ||
        si.si_pid != r.pid) {
      continue;
    }
    ::kill(-r.pid, SIGKILL);
    int status = 0;
    ::waitpid(r.pid, &status, 0);
    r.exited = true;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (r.code != 0 && first_failed_ < 0 && !stopping_) {
      first_failed_ = r.rank;
      result_ = r.code;
      std::string how = WIFEXITED(status)
                            ? "exited with code " + std::to_string(r.code)
                            : std::string("was killed by signal ") + strsignal(WTERMSIG(status));
      WriteAllFd(o_.stderr_fd, "cortado launch: rank " + std::to_string(r.rank) + " " + how +
                                   "; stopping the other ranks\n");
      BeginStop(SIGTERM, true);
    }
  }
}

// After a failure the grace period starts (SIGKILL when it ends); a forwarded signal has none.
void Supervisor::BeginStop(int sig, bool with_grace) {
  if (!stopping_) {
    stopping_ = true;
    kill_at_ = with_grace ? Deadline::After(o_.grace) : Deadline::Never();
  }
  KillAll(sig);
}

}  // namespace

int RunLauncher(const LauncherOptions& o) {
  LaunchPlan plan = PlanLaunch(o);
  SignalChannel signals;
  Supervisor supervisor(o, &signals);
  for (int local = 0; local < o.nproc; ++local) {
    try {
      supervisor.Add(SpawnRank(o, plan, local, signals.old_mask()));
    } catch (...) {
      supervisor.KillAll(SIGKILL);
      throw;
    }
  }
  plan.store.Reset();  // rank 0 has its copy
  while (!supervisor.Done()) supervisor.Tick();
  return supervisor.result();
}

}  // namespace cortado::dist
