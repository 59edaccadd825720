// The local launcher; see launcher.h. One poll loop watches the ranks' output pipes and a
// signalfd (SIGCHLD, SIGINT, SIGTERM, SIGHUP), so output, exits and signals are handled in
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

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

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

}  // namespace

int RunLauncher(const LauncherOptions& o) {
  if (o.command.empty()) Fail(ErrorKind::kConfig, "launch: no command to run (use -- CMD ...)");
  if (o.nproc < 1) Fail(ErrorKind::kConfig, "launch: --nproc must be at least 1");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes) {
    Fail(ErrorKind::kConfig, "launch: --node-rank ", o.node_rank, " is outside --nnodes ",
         o.nnodes);
  }
  const int world = o.nproc * o.nnodes;
  std::string master_host = "127.0.0.1";
  int master_port = 0;
  if (!o.master.empty()) {
    size_t colon = o.master.rfind(':');
    if (colon == std::string::npos) {
      Fail(ErrorKind::kConfig, "launch: --master '", o.master, "' is not HOST:PORT");
    }
    master_host = o.master.substr(0, colon);
    try {
      master_port = std::stoi(o.master.substr(colon + 1));
    } catch (const std::exception&) {
      master_port = -1;
    }
    if (master_port <= 0 || master_port > 65535) {
      Fail(ErrorKind::kConfig, "launch: --master '", o.master, "' has no valid port");
    }
  } else if (o.nnodes > 1) {
    Fail(ErrorKind::kConfig, "launch: --master HOST:PORT is required with --nnodes > 1");
  }
  std::string token;
  if (auto t = FindJobToken()) {
    token = *t;
  } else if (o.nnodes > 1) {
    Fail(ErrorKind::kConfig,
         "launch: several nodes need a shared job token: set CORTADO_JOB_TOKEN to the same value "
         "on every node");
  } else {
    token = RandomToken();
  }
  // Rank 0's store socket: bound here, handed over, so no other process can take the port.
  Fd store;
  if (o.node_rank == 0) {
    store = internal::ListenTcp(o.nnodes > 1 ? "0.0.0.0" : master_host, master_port,
                                std::max(128, world));
    master_port = internal::LocalPort(store.get());
  }

  // Signals arrive through a signalfd; children get the default mask and handlers back.
  sigset_t mask, old_mask;
  sigemptyset(&mask);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) sigaddset(&mask, s);
  if (sigprocmask(SIG_BLOCK, &mask, &old_mask) != 0) {
    Fail(ErrorKind::kSystem, "sigprocmask: ", internal::ErrnoText(errno));
  }
  Fd sfd(::signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK));
  struct RestoreMask {
    sigset_t old;
    ~RestoreMask() { sigprocmask(SIG_SETMASK, &old, nullptr); }
  } restore{old_mask};
  if (!sfd) Fail(ErrorKind::kSystem, "signalfd: ", internal::ErrnoText(errno));

  std::vector<Rank> ranks(static_cast<size_t>(o.nproc));
  std::vector<std::string> argv_store = o.command;
  std::vector<char*> argv;
  for (auto& a : argv_store) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t launcher_pid = ::getpid();

  auto kill_all = [&](int sig) {
    for (auto& r : ranks) {
      if (r.pid > 0 && !r.exited) ::kill(-r.pid, sig);
    }
  };

  for (int local = 0; local < o.nproc; ++local) {
    Rank& r = ranks[static_cast<size_t>(local)];
    r.rank = o.node_rank * o.nproc + local;
    int out_pipe[2], err_pipe[2];
    if (::pipe2(out_pipe, O_CLOEXEC) != 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
      kill_all(SIGKILL);
      Fail(ErrorKind::kSystem, "pipe: ", internal::ErrnoText(errno));
    }
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      if (kv.rfind("CORTADO_STORE_FD=", 0) == 0) continue;
      env.push_back(kv);
    }
    env.push_back("CORTADO_RANK=" + std::to_string(r.rank));
    env.push_back("CORTADO_WORLD_SIZE=" + std::to_string(world));
    env.push_back("CORTADO_LOCAL_RANK=" + std::to_string(local));
    env.push_back("CORTADO_LOCAL_WORLD_SIZE=" + std::to_string(o.nproc));
    env.push_back("CORTADO_NODE_RANK=" + std::to_string(o.node_rank));
    env.push_back("CORTADO_MASTER_ADDR=" + master_host);
    env.push_back("CORTADO_MASTER_PORT=" + std::to_string(master_port));
    env.push_back("CORTADO_JOB_TOKEN=" + token);
    if (r.rank == 0 && store) env.push_back("CORTADO_STORE_FD=" + std::to_string(store.get()));
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);

    pid_t pid = ::fork();
    if (pid < 0) {
      kill_all(SIGKILL);
      Fail(ErrorKind::kSystem, "fork: ", internal::ErrnoText(errno));
    }
    if (pid == 0) {
      // Child: own process group, die with the launcher, default signals, pipes as stdio.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != launcher_pid) ::_exit(128 + SIGTERM);
      for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::signal(s, SIG_DFL);
      ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
      if (r.rank == 0 && store) {
        int flags = ::fcntl(store.get(), F_GETFD);
        ::fcntl(store.get(), F_SETFD, flags & ~FD_CLOEXEC);
      }
      ::execvpe(argv[0], argv.data(), envp.data());
      std::string msg = "cortado launch: cannot run '" + argv_store[0] +
                        "': " + internal::ErrnoText(errno) + "\n";
      WriteAllFd(2, msg);
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so kill(-pid) works even before the child runs
    r.pid = pid;
    ::close(out_pipe[1]);
    ::close(err_pipe[1]);
    r.out.Reset(out_pipe[0]);
    r.err.Reset(err_pipe[0]);
  }
  store.Reset();  // rank 0 has its copy

  int result = 0;
  int first_failed = -1;
  bool stopping = false;
  Deadline kill_at = Deadline::Never();
  // After a rank fails the others get SIGTERM and, after the grace period, SIGKILL. A signal
  // the user sends is forwarded with no such timer: ranks may need a while to finish a step
  // and save a checkpoint; a second signal kills them at once.
  auto begin_stop = [&](int sig, bool with_grace) {
    if (!stopping) {
      stopping = true;
      kill_at = with_grace ? Deadline::After(o.grace) : Deadline::Never();
    }
    kill_all(sig);
  };

  auto prefix = [&](const Rank& r) {
    return o.prefix_output ? StrCat("[", r.rank, "] ") : std::string();
  };
  for (;;) {
    bool running = false, pipes_open = false;
    for (auto& r : ranks) {
      running |= !r.exited;
      pipes_open |= static_cast<bool>(r.out) || static_cast<bool>(r.err);
    }
    if (!running && !pipes_open) break;
    std::vector<pollfd> fds;
    std::vector<std::pair<Rank*, bool>> owner;  // (rank, is stdout)
    fds.push_back({sfd.get(), POLLIN, 0});
    owner.emplace_back(nullptr, false);
    for (auto& r : ranks) {
      if (r.out) {
        fds.push_back({r.out.get(), POLLIN, 0});
        owner.emplace_back(&r, true);
      }
      if (r.err) {
        fds.push_back({r.err.get(), POLLIN, 0});
        owner.emplace_back(&r, false);
      }
    }
    int timeout = stopping ? kill_at.RemainingMs(1000) : (running ? -1 : 1000);
    int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) break;
    if (stopping && kill_at.Expired()) {
      kill_all(SIGKILL);
      kill_at = Deadline::Never();
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!fds[i].revents) continue;
      Rank& r = *owner[i].first;
      bool is_out = owner[i].second;
      Fd& fd = is_out ? r.out : r.err;
      std::string& partial = is_out ? r.out_partial : r.err_partial;
      char buf[65536];
      ssize_t got = ::read(fd.get(), buf, sizeof(buf));
      if (got > 0) {
        partial.append(buf, static_cast<size_t>(got));
        EmitLines(&partial, prefix(r), is_out ? o.stdout_fd : o.stderr_fd, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        EmitLines(&partial, prefix(r), is_out ? o.stdout_fd : o.stderr_fd, true);
        fd.Reset();
      }
    }
    if (fds[0].revents) {
      signalfd_siginfo info;
      while (::read(sfd.get(), &info, sizeof(info)) == sizeof(info)) {
        int sig = static_cast<int>(info.ssi_signo);
        if (sig == SIGCHLD) continue;  // reaped below
        if (result == 0) result = 128 + sig;
        // Forward; a second signal while stopping escalates to SIGKILL.
        if (stopping) {
          kill_all(SIGKILL);
        } else {
          begin_stop(sig, false);
        }
      }
    }
    for (auto& r : ranks) {
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
      if (r.code != 0 && first_failed < 0 && !stopping) {
        first_failed = r.rank;
        result = r.code;
        std::string how = WIFEXITED(status)
                              ? "exited with code " + std::to_string(r.code)
                              : std::string("was killed by signal ") + strsignal(WTERMSIG(status));
        WriteAllFd(o.stderr_fd, "cortado launch: rank " + std::to_string(r.rank) + " " + how +
                                    "; stopping the other ranks\n");
        begin_stop(SIGTERM, true);
      }
    }
  }
  return result;
}

}  // namespace cortado::dist
