// Rendezvous key-value stores. Ranks publish their transport addresses under keys and wait for
// each other's; the store also hands out counters (Add). Two implementations:
//   InMemoryStore  - for ranks that are threads of one process (tests).
//   TcpStoreServer - served by rank 0 (one thread per client connection), reached through
//   TcpStore       - the client. Every client first sends a hello with the job token's digest,
//                    its rank, the world size and the caller's fingerprint; the server rejects a
//                    stranger (wrong token), a mismatched world size or fingerprint, and garbage
//                    bytes, with a reason the client turns into a kRejected error, and keeps
//                    serving everyone else. A member rejected for world size or fingerprint
//                    poisons the job: every rank waiting on the store fails with that reason
//                    instead of waiting for it until the deadline.
// Every blocking call takes a deadline and throws kTimeout naming the keys when it passes.
// All stores are thread-safe; one TcpStore sends one request at a time (a blocking Get holds
// it), so threads that wait on each other through the store should use a client each.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cortado/dist/deadline.h"
#include "cortado/dist/env.h"

namespace cortado::dist {

class Store {
 public:
  virtual ~Store() = default;
  virtual void Set(const std::string& key, const std::string& value) = 0;
  // Waits until key exists, then returns its value.
  virtual std::string Get(const std::string& key, Deadline deadline) = 0;
  // Waits until all keys exist.
  virtual void Wait(const std::vector<std::string>& keys, Deadline deadline) = 0;
  // Adds delta to the integer stored at key (0 when absent) and returns the new value.
  virtual int64_t Add(const std::string& key, int64_t delta) = 0;
  // True when all keys exist; does not wait.
  virtual bool Check(const std::vector<std::string>& keys) = 0;
};

class InMemoryStore final : public Store {
 public:
  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, Deadline deadline) override;
  void Wait(const std::vector<std::string>& keys, Deadline deadline) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  bool Check(const std::vector<std::string>& keys) override;

  // Marks the job as failed: every current and later wait throws kRejected with this reason.
  void Poison(const std::string& reason);

 private:
  bool HasAll(const std::vector<std::string>& keys) const;
  void WaitLocked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                  Deadline deadline);

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> data_;
  std::string poison_;
};

class TcpStoreServer {
 public:
  // Listens on host:port (port 0 picks a free one; see port()), or adopts listen_fd when it is
  // >= 0 (a socket bound and listening already, e.g. inherited from `cortado launch`).
  TcpStoreServer(JobIdentity identity, const std::string& host, int port, int listen_fd = -1);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const { return port_; }
  // Number of connections rejected so far (strangers, garbage, mismatches).
  int rejected_count() const;
  Store& local_store() { return store_; }

 private:
  void AcceptLoop();
  void Serve(int fd);

  JobIdentity identity_;
  int listen_fd_ = -1;
  int port_ = 0;
  int wake_fd_ = -1;  // eventfd that stops the accept loop
  InMemoryStore store_;
  std::thread accept_thread_;
  mutable std::mutex mu_;
  std::vector<int> client_fds_;
  std::vector<std::thread> client_threads_;
  int rejected_ = 0;
  bool stopping_ = false;
};

class TcpStore final : public Store {
 public:
  // Connects to the server at host:port, retrying until the deadline (rank 0 may start later),
  // and performs the hello. Throws kRejected with the server's reason, or kTimeout.
  TcpStore(const std::string& host, int port, const JobIdentity& identity, int rank,
           Deadline deadline, std::chrono::milliseconds op_timeout = std::chrono::seconds(300));
  ~TcpStore() override;

  void Set(const std::string& key, const std::string& value) override;
  std::string Get(const std::string& key, Deadline deadline) override;
  void Wait(const std::vector<std::string>& keys, Deadline deadline) override;
  int64_t Add(const std::string& key, int64_t delta) override;
  bool Check(const std::vector<std::string>& keys) override;

 private:
  std::string Call(uint8_t command, const std::vector<std::string>& args, int64_t number,
                   Deadline deadline, const std::string& what);

  std::string where_;  // "store at host:port", for messages
  int fd_ = -1;
  std::mutex mu_;
  std::chrono::milliseconds op_timeout_;
};

}  // namespace cortado::dist
