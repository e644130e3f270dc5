#include "embed/service/unix_socket.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "embed/service/shared_memory.h"

namespace ferry::embed::service {
namespace {

std::string TempSocket(const char* name) {
  return "/tmp/ferry-" + std::to_string(::getpid()) + "-" + name + ".sock";
}

TEST(EmbedSocket, PassesDescriptorsAndKeepsMessageBoundaries) {
  std::string path = TempSocket("fds");
  Result<UniqueFd> l = Listen(path);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Result<UniqueFd> c = Connect(path, Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(c.ok());
  Result<UniqueFd> s = Accept(l->get(), Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(s.ok());

  auto mem = SharedMemory::Create("test", 4096);
  ASSERT_TRUE(mem.ok());
  (*mem)->data()[100] = 77;
  int fds[] = {(*mem)->fd()};
  ASSERT_TRUE(Send(c->get(), "first", fds).ok());
  ASSERT_TRUE(Send(c->get(), "second").ok());
  Result<Message> m = Receive(s->get(), Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->bytes, "first");
  ASSERT_EQ(m->fds.size(), 1u);
  auto mapped = SharedMemory::Map(std::move(m->fds[0]));
  ASSERT_TRUE(mapped.ok()) << mapped.status().ToString();
  EXPECT_EQ((*mapped)->bytes(), 4096u);
  EXPECT_EQ((*mapped)->data()[100], 77);
  EXPECT_TRUE((*mapped)->Contains(4000, 96));
  EXPECT_FALSE((*mapped)->Contains(4000, 97));
  EXPECT_FALSE((*mapped)->Contains(~0ull, 2));
  Result<Message> m2 = Receive(s->get(), Deadline::After(std::chrono::seconds(5)));
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->bytes, "second");
  EXPECT_TRUE(m2->fds.empty());

  // Nothing more: the deadline ends the wait; a closed peer is kUnavailable.
  EXPECT_EQ(Receive(s->get(), Deadline::After(std::chrono::milliseconds(20))).status().code(),
            Code::kDeadlineExceeded);
  c->reset();
  EXPECT_EQ(Receive(s->get(), Deadline::After(std::chrono::seconds(5))).status().code(),
            Code::kUnavailable);
  ::unlink(path.c_str());
}

TEST(EmbedSocket, WakeDescriptorCancelsAWait) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  Result<UniqueFd> wake = MakeWakeFd();
  ASSERT_TRUE(wake.ok());
  SignalWakeFd(wake->get());
  EXPECT_EQ(
      Receive(a.get(), Deadline::After(std::chrono::seconds(30)), wake->get()).status().code(),
      Code::kCancelled);
}

TEST(EmbedSocket, OversizedMessageIsRejected) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  std::string big(kMaxMessageBytes + 100, 'x');
  ASSERT_EQ(::send(b.get(), big.data(), big.size(), 0), static_cast<ssize_t>(big.size()));
  EXPECT_EQ(Receive(a.get(), Deadline::After(std::chrono::seconds(5))).status().code(),
            Code::kInvalidArgument);
  EXPECT_EQ(Send(b.get(), big).code(), Code::kInvalidArgument);
}

TEST(EmbedSocket, ConnectWithoutListenerIsUnavailable) {
  EXPECT_EQ(
      Connect(TempSocket("none"), Deadline::After(std::chrono::milliseconds(30))).status().code(),
      Code::kUnavailable);
}

TEST(EmbedSharedMemory, RefusesUnsealedFiles) {
  int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  EXPECT_EQ(SharedMemory::Map(UniqueFd(fd)).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::embed::service
