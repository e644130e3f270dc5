// metrics_http: the GET client against a real engine's endpoint and against our own server,
// the sample parser, and the merge of two engines' texts into one exposition.
#include "metrics_http.h"

#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "ferry/engine.h"

namespace ferry::tools {
namespace {

using std::chrono::milliseconds;

std::unique_ptr<Engine> MakeEngine() {
  EngineOptions o;
  o.transports = {"local"};
  o.metrics_port = -1;
  auto engine = Engine::Create(o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  return engine.ok() ? std::move(engine).value() : nullptr;
}

TEST(MetricsUrl, ParsesTheFormsUsersWrite) {
  auto a = ParseMetricsUrl("127.0.0.1:9400");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 9400);
  EXPECT_EQ(a->path, "/metrics");
  auto b = ParseMetricsUrl("http://[::1]:80/x");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "::1");
  EXPECT_EQ(b->path, "/x");
  auto c = ParseMetricsUrl("localhost:1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "localhost");
  for (const char* bad : {"", "9400", "host:", "host:70000", "::1:80", "https://a:1", "a:0", "[::1:80"})
    EXPECT_EQ(ParseMetricsUrl(bad).status().code(), Code::kInvalidArgument) << bad;
}

TEST(MetricsHttp, FetchesARunningEnginesMetricsAndParsesThem) {
  auto engine = MakeEngine();
  ASSERT_NE(engine, nullptr);
  ASSERT_GT(engine->MetricsPort(), 0);
  auto text = FetchMetrics(MetricsUrl{"127.0.0.1", static_cast<uint16_t>(engine->MetricsPort()), "/metrics"},
                           milliseconds(5000));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_NE(text->find("# TYPE ferry_transfers_total counter"), std::string::npos);
  auto samples = ParsePrometheusSamples(*text);
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  const std::string key = "ferry_peers{engine=\"" + engine->Metrics().engine + "\"}";
  ASSERT_EQ(samples->count(key), 1u) << *text;
  EXPECT_EQ(samples->at(key), 0.0);
  // Another path is a 404, which is no metrics.
  auto missing = FetchMetrics(MetricsUrl{"127.0.0.1", static_cast<uint16_t>(engine->MetricsPort()), "/nope"},
                              milliseconds(5000));
  EXPECT_EQ(missing.status().code(), Code::kUnavailable);
}

TEST(MetricsHttp, NothingListeningIsUnavailableAndASilentPeerTimesOut) {
  // A port that was free a moment ago.
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(server.ok());
  const uint16_t port = static_cast<uint16_t>((*server)->port());
  server->reset();
  EXPECT_EQ(FetchMetrics(MetricsUrl{"127.0.0.1", port, "/metrics"}, milliseconds(2000)).status().code(),
            Code::kUnavailable);
  // A listener that never answers.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  auto silent = FetchMetrics(MetricsUrl{"127.0.0.1", ntohs(addr.sin_port), "/metrics"}, milliseconds(200));
  EXPECT_EQ(silent.status().code(), Code::kDeadlineExceeded);
  close(fd);
}

TEST(MetricsHttp, ParserRefusesMalformedLines) {
  auto ok = ParsePrometheusSamples("# HELP a x\na{l=\"v w}\"} 3 1700000000\nb +Inf\n\n");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(ok->at("a{l=\"v w}\"}"), 3.0);
  EXPECT_TRUE(std::isinf(ok->at("b")));
  EXPECT_EQ(ParsePrometheusSamples("a{l=\"x} 1\n").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParsePrometheusSamples("a notanumber\n").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(ParsePrometheusSamples("lonely\n").status().code(), Code::kInvalidArgument);
}

TEST(MetricsHttp, MergeGroupsFamiliesOnceAndMarksDeadTargets) {
  const std::string a =
      "# HELP ferry_x_seconds latency\n# TYPE ferry_x_seconds histogram\n"
      "ferry_x_seconds_bucket{engine=\"a\",le=\"+Inf\"} 1\nferry_x_seconds_count{engine=\"a\"} 1\n"
      "# HELP ferry_peers peers\n# TYPE ferry_peers gauge\nferry_peers{engine=\"a\"} 2\n";
  const std::string b =
      "# HELP ferry_x_seconds latency\n# TYPE ferry_x_seconds histogram\n"
      "ferry_x_seconds_bucket{engine=\"b\",le=\"+Inf\"} 4\nferry_x_seconds_count{engine=\"b\"} 4\n"
      "# HELP ferry_peers peers\n# TYPE ferry_peers gauge\nferry_peers{engine=\"b\"} 3\n";
  const std::string merged = MergePrometheus({Scrape{"h:1", Status::Ok(), a}, Scrape{"h:2", Status::Ok(), b},
                                              Scrape{"h:2", Status::Ok(), b},  // a duplicate adds nothing
                                              Scrape{"h:3", Status(Code::kUnavailable, "down"), ""}});
  const std::string want =
      "# HELP ferry_x_seconds latency\n# TYPE ferry_x_seconds histogram\n"
      "ferry_x_seconds_bucket{engine=\"a\",le=\"+Inf\"} 1\nferry_x_seconds_count{engine=\"a\"} 1\n"
      "ferry_x_seconds_bucket{engine=\"b\",le=\"+Inf\"} 4\nferry_x_seconds_count{engine=\"b\"} 4\n"
      "# HELP ferry_peers peers\n# TYPE ferry_peers gauge\nferry_peers{engine=\"a\"} 2\nferry_peers{engine=\"b\"} 3\n"
      "# HELP ferry_metrics_target_up 1 when the target's /metrics was scraped, 0 when not\n"
      "# TYPE ferry_metrics_target_up gauge\n"
      "ferry_metrics_target_up{target=\"h:1\"} 1\nferry_metrics_target_up{target=\"h:2\"} 1\n"
      "ferry_metrics_target_up{target=\"h:2\"} 1\nferry_metrics_target_up{target=\"h:3\"} 0\n";
  EXPECT_EQ(merged, want);
}

TEST(MetricsHttp, ServerServesTwoEnginesMergedOverIpv4AndRefusesOtherRequests) {
  auto e1 = MakeEngine();
  auto e2 = MakeEngine();
  ASSERT_TRUE(e1 && e2);
  auto render = [&] {
    std::vector<Scrape> s;
    for (Engine* e : {e1.get(), e2.get()}) {
      auto t = FetchMetrics(MetricsUrl{"127.0.0.1", static_cast<uint16_t>(e->MetricsPort()), "/metrics"},
                            milliseconds(5000));
      s.push_back(Scrape{std::to_string(e->MetricsPort()), t.status(), t.ok() ? *t : ""});
    }
    return MergePrometheus(s);
  };
  auto server = MetricsHttpServer::Start("127.0.0.1:0", render);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto text = FetchMetrics(MetricsUrl{"127.0.0.1", static_cast<uint16_t>((*server)->port()), "/metrics"},
                           milliseconds(10000));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  auto samples = ParsePrometheusSamples(*text);
  ASSERT_TRUE(samples.ok()) << samples.status().ToString();
  for (Engine* e : {e1.get(), e2.get()}) {
    EXPECT_EQ(samples->count("ferry_peers{engine=\"" + e->Metrics().engine + "\"}"), 1u) << *text;
    EXPECT_EQ(samples->at("ferry_metrics_target_up{target=\"" + std::to_string(e->MetricsPort()) + "\"}"), 1.0);
  }
  size_t types = 0;
  for (size_t at = 0; (at = text->find("# TYPE ferry_peers gauge", at)) != std::string::npos; ++at) ++types;
  EXPECT_EQ(types, 1u);
  EXPECT_EQ(FetchMetrics(MetricsUrl{"127.0.0.1", static_cast<uint16_t>((*server)->port()), "/other"},
                         milliseconds(5000))
                .status()
                .code(),
            Code::kUnavailable);
}

// A client that asks and never reads a long answer must not hold the server: the next fetch
// is served once the answer to it times out, and stopping the server does not wait for it.
TEST(MetricsHttp, AClientThatStopsReadingHoldsNeitherTheNextNorTheStop) {
  const std::string big(8 << 20, 'm');
  auto server = MetricsHttpServer::Start("127.0.0.1:0", [&] { return big; });
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const auto port = static_cast<uint16_t>((*server)->port());
  const auto stalled_client = [&] {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(port);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string get = "GET /metrics HTTP/1.0\r\n\r\n";
    EXPECT_EQ(send(fd, get.data(), get.size(), MSG_NOSIGNAL), static_cast<ssize_t>(get.size()));
    return fd;  // and never reads
  };
  const int stalled = stalled_client();
  auto text = FetchMetrics(MetricsUrl{"127.0.0.1", port, "/metrics"}, milliseconds(8000));
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, big);
  close(stalled);
  const int another = stalled_client();
  std::this_thread::sleep_for(milliseconds(200));  // the server is writing to it
  const auto stop = std::chrono::steady_clock::now();
  server->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - stop, milliseconds(500));
  close(another);
}

}  // namespace
}  // namespace ferry::tools
