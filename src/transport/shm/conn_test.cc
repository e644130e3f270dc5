// Conn::TrySend (core.h): an ack from an application thread never waits for a peer that does
// not read; it reports a full socket without failing the connection, and goes again once the
// peer reads.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>

#include "transport/shm/core.h"

namespace ferry::internal::shm {
namespace {

struct Pair {
  std::shared_ptr<Conn> conn;  // owns fds[0]
  int peer = -1;
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    conn = std::make_shared<Conn>(fds[0], Conn::Role::kTarget, "peer", std::chrono::seconds(1));
    peer = fds[1];
  }
  ~Pair() {
    if (peer >= 0) close(peer);
  }
};

Header Ack(uint64_t token) {
  Header h;
  h.type = MsgType::kAck;
  h.token = token;
  return h;
}

TEST(ShmConn, TrySendReportsAFullSocketAtOnceAndKeepsTheConnection) {
  Pair p;
  const auto start = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  Status s;
  while ((s = p.conn->TrySend(Ack(sent + 1))).ok() && sent < 1'000'000) ++sent;
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_EQ(s.code(), Code::kResourceExhausted) << s.ToString();
  EXPECT_GT(sent, 0u);
  EXPECT_LT(took, std::chrono::milliseconds(500)) << "TrySend waited for room";
  EXPECT_FALSE(p.conn->failed());

  // The peer reads one: the next ack goes, and the peer sees them in order.
  auto first = os::ReceiveMessage(p.peer, kHeaderBytes + 64);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto h = DecodeHeader(first->bytes.data(), first->bytes.size());
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->type, MsgType::kAck);
  EXPECT_EQ(h->token, 1u);
  EXPECT_TRUE(p.conn->TrySend(Ack(sent + 1)).ok());
  EXPECT_FALSE(p.conn->failed());
}

TEST(ShmConn, TrySendToAClosedPeerFailsTheConnection) {
  Pair p;
  close(p.peer);
  p.peer = -1;
  Status s = p.conn->TrySend(Ack(1));
  EXPECT_EQ(s.code(), Code::kUnavailable) << s.ToString();
  EXPECT_TRUE(p.conn->failed());
  EXPECT_EQ(p.conn->TrySend(Ack(2)).code(), Code::kUnavailable);
}

}  // namespace
}  // namespace ferry::internal::shm
