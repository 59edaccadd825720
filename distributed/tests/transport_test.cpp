// Every transport through its RDMA-shaped interface, from a transport factory (TCP, and UCX where
// it is built; the UCX cases skip, saying why, where it is not): registered regions, posted
// tagged sends and receives completing in any order, unexpected messages, large messages, a
// peer's abort, status queries. TCP alone: one connection's handshake driven by hand, strangers
// or garbage on the listening port during connection setup, and the interface choice.
#include "cortado/dist/transport.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cstring>
#include <numeric>
#include <thread>

#include "../src/common/socket.h"
#include "../src/transport/tcp/handshake.h"
#include "../src/transport/tcp/wire.h"
#include "../src/transport/transport_internal.h"
#include "cortado/dist/tcp_transport.h"
#include "cortado/dist/ucx_transport.h"

namespace cortado::dist {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A transport factory: rank r of a world of n, job identity ("tok", n, 42), on loopback.
using TransportFactory = std::function<std::unique_ptr<Transport>(int rank, int n)>;

// The transport `name` ("tcp" or "ucx") for rank r of a world of n.
std::unique_ptr<Transport> MakeTransport(const std::string& name, int rank, int n) {
  const JobIdentity identity{"tok", n, 42};
  if (name == "ucx") {
    UcxTransportOptions o;
    o.identity = identity;
    o.rank = rank;
    o.control_host = "127.0.0.1";
    return CreateUcxTransport(o);
  }
  TcpTransportOptions o;
  o.identity = identity;
  o.rank = rank;
  o.listen_host = "127.0.0.1";
  return CreateTcpTransport(o);
}

TransportFactory FactoryFor(const std::string& name) {
  return [name](int rank, int n) { return MakeTransport(name, rank, n); };
}

std::vector<std::unique_ptr<Transport>> MakeMesh(
    const TransportFactory& make, int n,
    const std::function<void(const std::vector<std::string>&)>& before_connect = nullptr) {
  std::vector<std::unique_ptr<Transport>> ts;
  std::vector<std::string> addrs;
  for (int r = 0; r < n; ++r) {
    ts.push_back(make(r, n));
    addrs.push_back(ts.back()->LocalAddress());
  }
  if (before_connect) before_connect(addrs);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        ts[static_cast<size_t>(r)]->Connect(addrs, Deadline::After(seconds(10)));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  return ts;
}

std::vector<std::unique_ptr<Transport>> MakeMesh(
    int n, const std::function<void(const std::vector<std::string>&)>& before_connect = nullptr) {
  return MakeMesh(FactoryFor("tcp"), n, before_connect);
}

// The suite every transport runs; the parameter names the transport.
class Transports : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "ucx" && !HasUcxTransport()) {
      GTEST_SKIP() << "the UCX transport is not built (libucx-dev was not found at configure time)";
    }
  }
  std::vector<std::unique_ptr<Transport>> Mesh(int n) {
    return MakeMesh(FactoryFor(GetParam()), n);
  }
};

TEST_P(Transports, TaggedMessagesMatchInAnyPostingOrder) {
  auto ts = Mesh(2);
  std::vector<uint32_t> a(1000), b(300000), z;  // b is large enough to wait for its receive
  std::iota(a.begin(), a.end(), 1u);
  std::iota(b.begin(), b.end(), 7u);
  std::vector<uint32_t> ra(a.size()), rb(b.size());
  auto sa = ts[0]->Register(a.data(), a.size() * 4);
  auto sb = ts[0]->Register(b.data(), b.size() * 4);
  auto sz = ts[0]->Register(nullptr, 0);
  auto ma = ts[1]->Register(ra.data(), ra.size() * 4);
  auto mb = ts[1]->Register(rb.data(), rb.size() * 4);
  auto mz = ts[1]->Register(nullptr, 0);
  Deadline d = Deadline::After(seconds(10));
  // Sent a, b, zero-length; received zero-length and b first, then a (which arrives
  // unexpected and is buffered).
  std::thread sender([&] {
    auto i1 = ts[0]->PostSend(1, *sa, 0, a.size() * 4, 11);
    auto i2 = ts[0]->PostSend(1, *sb, 0, b.size() * 4, 22);
    auto i3 = ts[0]->PostSend(1, *sz, 0, 0, 33);
    ts[0]->Wait(i1, d);
    ts[0]->Wait(i2, d);
    ts[0]->Wait(i3, d);
  });
  auto r3 = ts[1]->PostRecv(0, *mz, 0, 0, 33);
  auto r2 = ts[1]->PostRecv(0, *mb, 0, rb.size() * 4, 22);
  ts[1]->Wait(r2, d);
  ts[1]->Wait(r3, d);
  auto r1 = ts[1]->PostRecv(0, *ma, 0, ra.size() * 4, 11);
  ts[1]->Wait(r1, d);
  sender.join();
  EXPECT_EQ(ra, a);
  EXPECT_EQ(rb, b);
}

// Receives posted just in time, while the sender runs ahead: messages arrive unexpected, or
// are half-way in when their receive is posted, and must still land (no loss, no hang).
TEST_P(Transports, ReceivesPostedWhileTheirMessagesArrive) {
  auto ts = Mesh(2);
  const size_t n = 3000, words = 12000;  // 48 KB messages: buffered when unexpected
  std::vector<uint32_t> out(words * 4), in(words);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint32_t>(i * 2654435761u);
  auto so = ts[0]->Register(out.data(), out.size() * 4);
  auto si = ts[1]->Register(in.data(), in.size() * 4);
  Deadline d = Deadline::After(seconds(20));
  std::thread sender([&] {
    std::vector<RequestId> ids;
    for (size_t m = 0; m < n; ++m) {
      ids.push_back(ts[0]->PostSend(1, *so, (m % 4) * words * 4, words * 4, m));
      if (ids.size() > 8) {
        ts[0]->Wait(ids.front(), d);
        ids.erase(ids.begin());
      }
    }
    for (auto id : ids) ts[0]->Wait(id, d);
  });
  size_t bad = 0;
  for (size_t m = 0; m < n; ++m) {
    auto q = ts[1]->PostRecv(0, *si, 0, words * 4, m);
    ts[1]->Wait(q, d);
    if (in[words / 2] != out[(m % 4) * words + words / 2] ||
        in[words - 1] != out[(m % 4) * words + words - 1])
      ++bad;
  }
  sender.join();
  EXPECT_EQ(bad, 0u);
}

TEST_P(Transports, LargeMessagesInBothDirectionsAtOnce) {
  auto ts = Mesh(2);
  const size_t n = 8 << 20;
  std::vector<std::vector<char>> out(2, std::vector<char>(n)), in(2, std::vector<char>(n));
  for (size_t i = 0; i < n; ++i) {
    out[0][i] = static_cast<char>(i * 3);
    out[1][i] = static_cast<char>(i * 5 + 1);
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto so = ts[static_cast<size_t>(r)]->Register(out[static_cast<size_t>(r)].data(), n);
      auto si = ts[static_cast<size_t>(r)]->Register(in[static_cast<size_t>(r)].data(), n);
      Deadline d = Deadline::After(seconds(20));
      // Two halves each way, so several frames are in flight on one connection.
      std::vector<RequestId> ids;
      for (size_t h = 0; h < 2; ++h) {
        ids.push_back(ts[static_cast<size_t>(r)]->PostRecv(1 - r, *si, h * n / 2, n / 2, h));
        ids.push_back(ts[static_cast<size_t>(r)]->PostSend(1 - r, *so, h * n / 2, n / 2, h));
      }
      for (auto id : ids) ts[static_cast<size_t>(r)]->Wait(id, d);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(in[1], out[0]);
  EXPECT_EQ(in[0], out[1]);
}

// What rank `rank` of a world of 2 checks and sends in its handshakes, for job `token`.
tcp::HandshakeContext HandshakeContextFor(int rank, const std::string& token) {
  const JobIdentity identity{token, 2, 42};
  tcp::HandshakeContext c;
  c.rank = rank;
  c.size = 2;
  c.mine.from_rank = static_cast<uint32_t>(rank);
  c.mine.world_size = 2;
  c.mine.token_digest = identity.TokenDigest();
  c.mine.fingerprint = identity.fingerprint;
  c.deadline = Deadline::After(seconds(5));
  c.connected = [](int) { return false; };
  return c;
}

// Runs h's handlers as poll() reports its socket until one returns other than kRetry (or the
// handler throws, or 5 s pass: kRetry).
tcp::Step Drive(tcp::Handshake& h, const tcp::HandshakeContext& context) {
  const Deadline until = Deadline::After(seconds(5));
  while (!until.Expired()) {
    pollfd p{};
    if (!h.PollFor(&p)) continue;
    if (::poll(&p, 1, 10) <= 0) continue;
    const tcp::Step step = h.OnReady(context);
    if (step != tcp::Step::kRetry) return step;
  }
  return tcp::Step::kRetry;
}

// Rank 1 dials rank 0 with the job's token, then with another job's: the first is admitted on
// both sides, naming each other; the second is dropped by rank 0, and rank 1's dial fails
// saying rank 0 rejected it.
TEST(TcpHandshake, AdmitsTheJobsRankAndRefusesAnotherJobs) {
  for (const std::string token : {"tok", "another job"}) {
    internal::Fd listener = internal::ListenTcp("127.0.0.1", 0);
    const std::string address = StrCat("127.0.0.1:", internal::LocalPort(listener.get()));
    tcp::Handshake dial = tcp::Handshake::Dial(0, address);
    pollfd p{};
    ASSERT_TRUE(dial.PollFor(&p));
    ASSERT_EQ(::poll(&p, 1, 5000), 1);                                          // connected
    ASSERT_EQ(dial.OnReady(HandshakeContextFor(1, token)), tcp::Step::kRetry);  // hello sent
    EXPECT_EQ(dial.state(), tcp::Handshake::State::kAwaitingAck);
    const int fd = ::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    ASSERT_GE(fd, 0);
    tcp::Handshake accepted = tcp::Handshake::Accept(internal::Fd(fd));
    EXPECT_TRUE(accepted.inbound());
    const tcp::Step verdict = Drive(accepted, HandshakeContextFor(0, "tok"));
    if (token == "tok") {
      EXPECT_EQ(verdict, tcp::Step::kEstablished);
      EXPECT_EQ(accepted.peer(), 1);
      EXPECT_EQ(Drive(dial, HandshakeContextFor(1, token)), tcp::Step::kEstablished);
      EXPECT_EQ(dial.peer(), 0);
      continue;
    }
    EXPECT_EQ(verdict, tcp::Step::kDrop);
    try {
      Drive(dial, HandshakeContextFor(1, token));
      ADD_FAILURE() << "a rejected dial must fail";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kRejected);
      EXPECT_NE(std::string(e.what()).find("rank 0 rejected rank 1: job token mismatch"),
                std::string::npos)
          << e.what();
    }
  }
}

// SpinPolicy: waits poll while polling pays; after two that polled and slept anyway they go
// straight to sleep, but every 32nd still polls, and one that completes while polling resumes it.
TEST(SpinPolicy, PollsOnlyWhilePollingPays) {
  internal::SpinPolicy p;
  EXPECT_TRUE(p.ShouldSpin());
  p.Record(false);
  EXPECT_TRUE(p.ShouldSpin());
  p.Record(false);
  int polled = 0;
  for (int i = 0; i < 64; ++i) polled += p.ShouldSpin() ? 1 : 0;
  EXPECT_EQ(polled, 2);  // the probes
  p.Record(true);        // a probe that paid off
  EXPECT_TRUE(p.ShouldSpin());
  EXPECT_TRUE(p.ShouldSpin());
}

// A payload that trickles in over a slow link (here: rank 1 is this test, writing a 256 KB
// message in 64 pieces 2 ms apart, as a shaped link would deliver it) wakes the waiting rank a
// few times, not once per piece: the receive low-water mark holds the wake-up until the rest of
// the payload is there. A small message after it still wakes the waiter at once (the mark is back
// to one byte between payloads), or its Wait would run into the deadline.
TEST(TcpTransport, ASlowlyArrivingPayloadCostsAFewWakeUpsNotOnePerPiece) {
  auto t = MakeTransport("tcp", 0, 2);
  std::string connect_error;
  std::thread connect([&] {
    try {
      t->Connect({t->LocalAddress(), "unused: rank 1 dials"}, Deadline::After(seconds(10)));
    } catch (const std::exception& e) {
      connect_error = e.what();
    }
  });
  tcp::Handshake dial = tcp::Handshake::Dial(0, t->LocalAddress());
  ASSERT_EQ(Drive(dial, HandshakeContextFor(1, "tok")), tcp::Step::kEstablished);
  connect.join();
  ASSERT_EQ(connect_error, "");
  internal::Fd peer = dial.TakeFd();
  internal::SetNonBlocking(peer.get(), false);
  internal::SetNoDelay(peer.get());
  auto send_all = [&](const void* data, size_t n) {
    const char* p = static_cast<const char*>(data);
    while (n > 0) {
      const ssize_t k = ::send(peer.get(), p, n, MSG_NOSIGNAL);
      if (k <= 0) return false;
      p += k;
      n -= static_cast<size_t>(k);
    }
    return true;
  };

  constexpr size_t kBytes = 256 << 10, kPieces = 64;
  std::vector<char> sent(kBytes), got(kBytes, 0), small(16, 0);
  for (size_t i = 0; i < kBytes; ++i) sent[i] = static_cast<char>(i * 7 + 1);
  auto region = t->Register(got.data(), got.size());
  auto small_region = t->Register(small.data(), small.size());
  t->BeginOperation(1);  // this thread drives, as the communicator's worker does
  const RequestId big = t->PostRecv(1, *region, 0, kBytes, 5);
  const RequestId tiny = t->PostRecv(1, *small_region, 0, small.size(), 6);
  bool sent_ok = true;
  std::thread writer([&] {
    const internal::FrameHeader h = internal::MakeHeader(internal::kFrameData, 5, kBytes);
    sent_ok &= send_all(&h, sizeof(h));
    for (size_t i = 0; i < kPieces; ++i) {
      std::this_thread::sleep_for(milliseconds(2));
      sent_ok &= send_all(sent.data() + i * (kBytes / kPieces), kBytes / kPieces);
    }
    std::this_thread::sleep_for(milliseconds(50));
    const internal::FrameHeader h2 = internal::MakeHeader(internal::kFrameData, 6, 16);
    const char payload[16] = "fifteen bytes..";
    sent_ok &= send_all(&h2, sizeof(h2));
    sent_ok &= send_all(payload, sizeof(payload));
  });
  const uint64_t before = t->WaitSleeps();
  t->Wait(big, Deadline::After(seconds(10)));
  const uint64_t sleeps = t->WaitSleeps() - before;
  const auto t_small = std::chrono::steady_clock::now();
  t->Wait(tiny, Deadline::After(seconds(10)));
  const double small_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_small).count();
  t->EndOperation(1);
  writer.join();
  EXPECT_TRUE(sent_ok);
  EXPECT_EQ(got, sent);
  EXPECT_EQ(std::string(small.data()), "fifteen bytes..");
  EXPECT_GE(sleeps, 1u);  // it did wait for the link
  EXPECT_LE(sleeps, 8u) << "one wake-up per piece: the low-water mark is not in effect";
  EXPECT_LT(small_s, 2.0) << "the small message after the payload did not wake the waiter";
  ::shutdown(peer.get(), SHUT_RDWR);
}

TEST(TcpTransport, StrangersAndGarbageDuringSetupAreRejectedAndTheMeshForms) {
  int rejected_replies = 0;
  auto ts = MakeMesh(3, [&](const std::vector<std::string>& addrs) {
    // Before the ranks connect, knock on rank 0's port with garbage and with a hello from
    // another job; both connections stay open, so rank 0 must answer them while it sets up.
    std::string host = "127.0.0.1";
    int port = std::stoi(addrs[0].substr(addrs[0].rfind(':') + 1));
    static std::vector<internal::Fd> keep;
    auto garbage = internal::ConnectTcpRetry(host, port, Deadline::After(seconds(2)), "g");
    std::string junk = "\x16\x03\x01 garbage that is not a frame header";
    (void)!::send(garbage.get(), junk.data(), junk.size(), MSG_NOSIGNAL);
    keep.push_back(std::move(garbage));
    auto stranger = internal::ConnectTcpRetry(host, port, Deadline::After(seconds(2)), "s");
    internal::HelloPayload hello{};
    hello.from_rank = 2;
    hello.to_rank = 0;
    hello.world_size = 3;
    hello.token_digest = Fingerprint("another job");
    hello.fingerprint = 42;
    auto h = internal::MakeHeader(internal::kFrameHello, 0, sizeof(hello));
    std::string bytes(reinterpret_cast<char*>(&h), sizeof(h));
    bytes.append(reinterpret_cast<char*>(&hello), sizeof(hello));
    (void)!::send(stranger.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL);
    keep.push_back(std::move(stranger));
    rejected_replies = static_cast<int>(keep.size());
  });
  EXPECT_EQ(rejected_replies, 2);
  // The mesh works.
  float x = 1, y = 0;
  auto sx = ts[2]->Register(&x, 4);
  auto sy = ts[0]->Register(&y, 4);
  auto s = ts[2]->PostSend(0, *sx, 0, 4, 5);
  auto q = ts[0]->PostRecv(2, *sy, 0, 4, 5);
  ts[0]->Wait(q, Deadline::After(seconds(5)));
  ts[2]->Wait(s, Deadline::After(seconds(5)));
  EXPECT_EQ(y, 1.0f);
}

TEST_P(Transports, AbortingPeerIsNamedByBystanders) {
  auto ts = Mesh(3);
  // Rank 1 gives up while rank 0 waits for rank 2: rank 0 learns it anyway, naming rank 1.
  float y = 0;
  auto sy = ts[0]->Register(&y, 4);
  auto q = ts[0]->PostRecv(2, *sy, 0, 4, 9);  // waits on rank 2, a bystander
  ts[1]->Abort(1, "test: rank 1 gives up");
  try {
    ts[0]->Wait(q, Deadline::After(seconds(5)));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kPeerFailure);
    EXPECT_EQ(e.peer_rank(), 1);
    EXPECT_NE(std::string(e.what()).find("rank 1 aborted: test: rank 1 gives up"),
              std::string::npos)
        << e.what();
  }
}

TEST_P(Transports, StatusQueryReportsEachRanksOperation) {
  auto ts = Mesh(3);
  // Rank 1 is inside operation 5, waiting for rank 2 (its waiting thread answers queries);
  // rank 2 finished operation 4 and is idle (its progress thread answers).
  float x = 3, y = 0;
  auto sx = ts[2]->Register(&x, 4);
  auto sy = ts[1]->Register(&y, 4);
  ts[2]->BeginOperation(4);
  ts[2]->EndOperation(4);
  std::thread rank1([&] {
    ts[1]->BeginOperation(5);
    auto q = ts[1]->PostRecv(2, *sy, 0, 4, 77);
    ts[1]->Wait(q, Deadline::After(seconds(10)));
    ts[1]->EndOperation(5);
  });
  std::this_thread::sleep_for(milliseconds(100));
  ts[0]->BeginOperation(5);
  auto status = ts[0]->QueryStatus(Deadline::After(seconds(5)));
  ts[0]->EndOperation(5);
  auto s = ts[2]->PostSend(1, *sx, 0, 4, 77);
  ts[2]->Wait(s, Deadline::After(seconds(5)));
  rank1.join();
  EXPECT_EQ(y, 3.0f);
  ASSERT_EQ(status.size(), 3u);
  EXPECT_TRUE(status[1].responded);
  EXPECT_EQ(status[1].ops_started, 5u);
  EXPECT_TRUE(status[2].responded);
  EXPECT_EQ(status[2].ops_started, 4u);
  EXPECT_EQ(status[2].ops_finished, 4u);
}

TEST(TcpTransport, InterfaceChoice) {
  EXPECT_EQ(InterfaceAddress("lo"), "127.0.0.1");
  try {
    InterfaceAddress("nosuchif0");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kConfig);
    EXPECT_NE(std::string(e.what()).find("CORTADO_SOCKET_IFNAME='nosuchif0'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("lo"), std::string::npos) << e.what();
  }
  EXPECT_EQ(RouteAddressTo("localhost"), "127.0.0.1");
}

INSTANTIATE_TEST_SUITE_P(Each, Transports, ::testing::Values("tcp", "ucx"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace cortado::dist
