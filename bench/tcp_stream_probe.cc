// One TCP stream over loopback, as fast as the kernel moves it: a thread sends `total` bytes
// from a buffer of `ring` bytes in send() calls of `chunk`, another receives them into a buffer
// of `ring` bytes (blocking calls, TCP_NODELAY). The ceiling of any design that carries a
// transfer on one socket, whatever its framing (bench/results/ucx_two_process.md).
// Run: build/release/bench/ferry_probe_tcp_stream [ring bytes] [chunk bytes]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>
int main(int argc, char** argv) {
  size_t ring = argc > 1 ? atol(argv[1]) : (1 << 20), ch = argc > 2 ? atol(argv[2]) : (1 << 20);
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{}; a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t l = sizeof a;
  if (ls < 0 || bind(ls, (sockaddr*)&a, sizeof a) != 0 || listen(ls, 1) != 0 || getsockname(ls, (sockaddr*)&a, &l) != 0) {
    perror("listening socket");
    return 1;
  }
  const size_t total = size_t(4) << 30;
  std::vector<char> dst(ring), src(ring, 1);
  std::thread rx([&] {
    int c = accept(ls, nullptr, nullptr); size_t got = 0;
    while (got < total) { ssize_t n = recv(c, dst.data() + (got % ring), std::min(ch, ring - got % ring), 0); if (n <= 0) break; got += n; }
    close(c);
  });
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0 || connect(s, (sockaddr*)&a, sizeof a) != 0) {
    perror("connect");
    std::exit(1);  // the receiving thread waits in accept
  }
  int one = 1; setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  auto t0 = std::chrono::steady_clock::now(); size_t sent = 0;
  while (sent < total) {
    ssize_t n = send(s, src.data() + (sent % ring), std::min(ch, ring - sent % ring), 0);
    if (n <= 0) {
      perror("send");
      std::exit(1);
    }
    sent += static_cast<size_t>(n);
  }
  close(s); rx.join();
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("ring %zu chunk %zu: %.2f GB/s\n", ring, ch, total / sec / 1e9);
}
