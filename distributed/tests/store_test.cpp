// The rendezvous stores: set/get/wait/add with deadlines, and the TCP store's admission control
// (strangers, garbage bytes, mismatched world size or fingerprint) while it keeps serving.
#include "cortado/dist/store.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "../src/common/socket.h"

namespace cortado::dist {
namespace {

using std::chrono::milliseconds;

JobIdentity Identity(int world = 2, uint64_t fingerprint = 7) {
  return JobIdentity{"secret-token", world, fingerprint};
}

// `other` reaches the same data (a second client: one TcpStore serializes its calls).
void ExerciseStore(Store& store, Store& other) {
  store.Set("a", "1");
  EXPECT_EQ(store.Get("a", Deadline::After(milliseconds(500))), "1");
  EXPECT_TRUE(store.Check({"a"}));
  EXPECT_FALSE(store.Check({"a", "b"}));
  EXPECT_EQ(store.Add("n", 5), 5);
  EXPECT_EQ(store.Add("n", -2), 3);
  std::string big(1 << 20, 'x');
  store.Set("big", big);
  EXPECT_EQ(store.Get("big", Deadline::After(milliseconds(2000))), big);
  // A waiter is released by a later set from another thread.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    other.Set("late", "v");
  });
  try {
    store.Wait({"a", "late"}, Deadline::After(milliseconds(5000)));
  } catch (const Error& e) {
    ADD_FAILURE() << e.what();
  }
  setter.join();
  // A missing key times out at the deadline, naming the key.
  auto t0 = Clock::now();
  try {
    store.Get("never", Deadline::After(milliseconds(200)));
    ADD_FAILURE() << "no timeout";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_GE(Clock::now() - t0, milliseconds(190));
  EXPECT_LT(Clock::now() - t0, milliseconds(3000));
}

TEST(InMemoryStore, SetGetWaitAddAndDeadlines) {
  InMemoryStore store;
  ExerciseStore(store, store);
}

TEST(TcpStore, SetGetWaitAddAndDeadlines) {
  TcpStoreServer server(Identity(), "127.0.0.1", 0);
  TcpStore client("127.0.0.1", server.port(), Identity(), 1, Deadline::After(milliseconds(5000)));
  TcpStore other("127.0.0.1", server.port(), Identity(), 0, Deadline::After(milliseconds(5000)));
  ExerciseStore(client, other);
  // The server's own view is the same store.
  EXPECT_EQ(server.local_store().Get("a", Deadline::After(milliseconds(100))), "1");
}

TEST(TcpStore, ManyClientsConcurrently) {
  TcpStoreServer server(Identity(8), "127.0.0.1", 0);
  std::vector<std::thread> threads;
  for (int r = 1; r < 8; ++r) {
    threads.emplace_back([&, r] {
      TcpStore c("127.0.0.1", server.port(), Identity(8), r, Deadline::After(milliseconds(5000)));
      for (int i = 0; i < 50; ++i) c.Add("counter", 1);
      c.Set("done/" + std::to_string(r), "1");
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(server.local_store().Add("counter", 0), 7 * 50);
}

TEST(TcpStore, ClientWaitsForALateServer) {
  // Reserve a port, free it, and start the server only after the client began retrying.
  int port;
  {
    auto fd = internal::ListenTcp("127.0.0.1", 0);
    port = internal::LocalPort(fd.get());
  }
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(200));
    server = std::make_unique<TcpStoreServer>(Identity(), "127.0.0.1", port);
  });
  TcpStore client("127.0.0.1", port, Identity(), 1, Deadline::After(milliseconds(5000)));
  client.Set("k", "v");
  starter.join();
  EXPECT_EQ(server->local_store().Get("k", Deadline::After(milliseconds(100))), "v");
}

TEST(TcpStore, StrangerAndGarbageAreRejectedAndTheStoreKeepsServing) {
  TcpStoreServer server(Identity(), "127.0.0.1", 0);
  // A client of another job (different token).
  try {
    TcpStore stranger("127.0.0.1", server.port(), JobIdentity{"other-job", 2, 7}, 1,
                      Deadline::After(milliseconds(2000)));
    ADD_FAILURE() << "stranger admitted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRejected);
    EXPECT_NE(std::string(e.what()).find("job token mismatch"), std::string::npos) << e.what();
  }
  // Garbage bytes: an HTTP request on the port gets a rejection and a close.
  {
    auto fd = internal::ConnectTcpRetry("127.0.0.1", server.port(),
                                        Deadline::After(milliseconds(2000)), "garbage");
    std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_EQ(::send(fd.get(), junk.data(), junk.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(junk.size()));
    std::string reply;
    char buf[512];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof(buf), 0)) > 0)
      reply.append(buf, static_cast<size_t>(n));
    EXPECT_NE(reply.find("not a Cortado store client"), std::string::npos) << reply;
  }
  // Random binary garbage, then a connection that says nothing and hangs up.
  {
    auto fd = internal::ConnectTcpRetry("127.0.0.1", server.port(),
                                        Deadline::After(milliseconds(2000)), "garbage");
    std::string junk(100000, '\xff');
    (void)!::send(fd.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
  }
  {
    auto fd = internal::ConnectTcpRetry("127.0.0.1", server.port(),
                                        Deadline::After(milliseconds(2000)), "silent");
  }
  // Members are still served.
  TcpStore member("127.0.0.1", server.port(), Identity(), 1, Deadline::After(milliseconds(2000)));
  member.Set("still", "serving");
  EXPECT_EQ(member.Get("still", Deadline::After(milliseconds(500))), "serving");
  EXPECT_GE(server.rejected_count(), 2);
}

TEST(TcpStore, MismatchedWorldSizeOrFingerprintPoisonsTheJob) {
  for (bool world : {true, false}) {
    TcpStoreServer server(Identity(2, 7), "127.0.0.1", 0);
    JobIdentity bad = world ? Identity(3, 7) : Identity(2, 8);
    // Rank 0 is waiting for rank 1's key when the misconfigured rank 1 knocks.
    std::string rank0_error;
    std::thread rank0([&] {
      try {
        server.local_store().Get("addr/1", Deadline::After(milliseconds(10000)));
      } catch (const Error& e) {
        rank0_error = e.what();
      }
    });
    try {
      TcpStore client("127.0.0.1", server.port(), bad, 1, Deadline::After(milliseconds(2000)));
      ADD_FAILURE() << "mismatch admitted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRejected);
      std::string want = world ? "world size mismatch: rank 1 says 3, rank 0 says 2"
                               : "fingerprint mismatch: rank 1 has 0x8, rank 0 has 0x7";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
    rank0.join();
    EXPECT_NE(rank0_error.find("mismatch"), std::string::npos) << rank0_error;
  }
}

}  // namespace
}  // namespace cortado::dist
