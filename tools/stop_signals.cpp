#include "tools/stop_signals.h"

#include <pthread.h>
#include <signal.h>

namespace cortado::tools {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_quit{false};  // the watcher's own exit, at destruction
std::atomic<int> g_signal{0};
extern "C" void OnStopSignal(int sig) {
  g_signal = sig;
  g_stop = true;
}

sigset_t StopSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

StopSignals::StopSignals() {
  g_stop = false;
  g_quit = false;
  g_signal = 0;
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const sigset_t set = StopSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  watcher_ = std::thread([set] {
    for (;;) {
      int sig = 0;
      if (sigwait(&set, &sig) != 0) continue;
      if (g_quit.load()) return;
      g_signal = sig;
      g_stop = true;
    }
  });
}

StopSignals::~StopSignals() {
  // Wake the watcher with a signal only it can take (the others block it, or never see it
  // again once the handler's flag is set), and let it leave.
  g_quit = true;
  pthread_kill(watcher_.native_handle(), SIGTERM);
  watcher_.join();
  const sigset_t set = StopSet();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

const std::atomic<bool>* StopSignals::flag() const { return &g_stop; }
int StopSignals::signal() const { return g_signal.load(); }

}  // namespace cortado::tools
