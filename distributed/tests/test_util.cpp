// See test_util.h.
#include "test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "../src/common/socket.h"

extern char** environ;

namespace cortado::dist::testing {

std::string ReadWholeFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

long long MonotonicMicros() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<long long>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

namespace {

// What worker rank r of n sees: none of this process's CORTADO_ settings (each test states its
// own) except the test suite's own (CORTADO_TEST_*, such as the matrix's large count), the job's
// place and identity, then `env` and the rank's own additions.
std::vector<std::string> WorkerEnvironment(
    int r, int n, int port, const std::string& token, int store_fd,
    const std::map<std::string, std::string>& env,
    const std::function<std::map<std::string, std::string>(int)>& per_rank_env) {
  std::map<std::string, std::string> vars;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos &&
        (kv.rfind("CORTADO_", 0) != 0 || kv.rfind("CORTADO_TEST_", 0) == 0))
      vars[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  vars["CORTADO_RANK"] = std::to_string(r);
  vars["CORTADO_WORLD_SIZE"] = std::to_string(n);
  vars["CORTADO_MASTER_ADDR"] = "127.0.0.1";
  vars["CORTADO_MASTER_PORT"] = std::to_string(port);
  vars["CORTADO_JOB_TOKEN"] = token;
  vars["CORTADO_CONNECT_TIMEOUT_S"] = "30";
  if (r == 0) vars["CORTADO_STORE_FD"] = std::to_string(store_fd);
  for (const auto& [k, v] : env) vars[k] = v;
  if (per_rank_env) {
    for (const auto& [k, v] : per_rank_env(r)) vars[k] = v;
  }
  std::vector<std::string> out;
  for (const auto& [k, v] : vars) out.push_back(k + "=" + v);
  return out;
}

// Starts the worker with `args` and environment `env`, its output into log_fd; inherit_fd (or
// -1) stays open across exec (rank 0's store socket).
pid_t SpawnWorker(const std::vector<std::string>& args, std::vector<std::string> env, int log_fd,
                  int inherit_fd) {
  std::vector<std::string> argv_strings = {CORTADO_DIST_TEST_WORKER};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv, envp;  // null-terminated, as execve wants
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    if (inherit_fd >= 0) {
      int flags = ::fcntl(inherit_fd, F_GETFD);
      ::fcntl(inherit_fd, F_SETFD, flags & ~FD_CLOEXEC);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  return pid;
}

// Each worker's exit code (128 + signal when killed by one); those still running after
// timeout_s are killed and get -1.
void AwaitWorkers(const std::vector<pid_t>& pids, double timeout_s,
                  std::vector<ProcessResult>* results) {
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  size_t left = pids.size();
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      if (::waitpid(pids[i], &status, WNOHANG) == pids[i]) {
        done[i] = true;
        --left;
        (*results)[i].code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) {
          ::kill(pids[i], SIGKILL);
          ::waitpid(pids[i], nullptr, 0);
          (*results)[i].code = -1;
        }
      }
      break;
    }
    ::usleep(2000);
  }
}

}  // namespace

std::vector<ProcessResult> RunProcesses(
    int n, const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
    double timeout_s, const std::function<std::map<std::string, std::string>(int)>& per_rank_env) {
  internal::Fd store = internal::ListenTcp("127.0.0.1", 0);
  int port = internal::LocalPort(store.get());
  std::random_device rd;
  std::string token = "test-" + std::to_string(rd()) + std::to_string(rd());
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  for (int r = 0; r < n; ++r) {
    char path[] = "/tmp/cortado_dist_test_XXXXXX";
    int log_fd = ::mkstemp(path);
    logs.push_back(path);
    pids.push_back(SpawnWorker(args,
                               WorkerEnvironment(r, n, port, token, store.get(), env, per_rank_env),
                               log_fd, r == 0 ? store.get() : -1));
    ::close(log_fd);
  }
  store.Reset();
  std::vector<ProcessResult> results(static_cast<size_t>(n));
  AwaitWorkers(pids, timeout_s, &results);
  for (size_t i = 0; i < logs.size(); ++i) {
    results[i].output = ReadWholeFile(logs[i]);
    ::unlink(logs[i].c_str());
  }
  return results;
}

}  // namespace cortado::dist::testing
