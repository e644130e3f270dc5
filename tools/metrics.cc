// `ferry metrics`: the user's tool beside running engines (EngineOptions::metrics_port, `ferry
// bench --listen --metrics-port`).
//   ferry metrics URL|HOST:PORT [--json [FILE]]   prints one engine's /metrics (Prometheus text,
//                                                 or a JSON object "name{labels}" -> value)
//   ferry metrics --serve [HOST:]PORT --targets A,B,...
//                                                 serves GET /metrics that merges the targets'
//                                                 (each scraped on every request), so that one
//                                                 scrape target covers every rank of a host;
//                                                 runs until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "json_out.h"
#include "metrics_http.h"

namespace ferry::tools {
namespace {

constexpr std::string_view kCmd = "metrics";

struct MetricsFlags {
  std::string url;
  std::string serve;
  std::vector<std::string> targets;
  double timeout_s = 5;
  JsonFlag json;
};

std::atomic<bool> g_stop{false};
void OnStop(int) { g_stop.store(true); }

int Print(const MetricsFlags& f) {
  Result<MetricsUrl> url = ParseMetricsUrl(f.url);
  if (!url.ok()) return Fail(kCmd, url.status());
  Result<std::string> text = FetchMetrics(*url, std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000)));
  if (!text.ok()) return Fail(kCmd, text.status());
  if (!f.json.given()) {
    fmt::print("{}", *text);
    return 0;
  }
  Result<std::map<std::string, double>> samples = ParsePrometheusSamples(*text);
  if (!samples.ok()) return Fail(kCmd, samples.status());
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  for (const auto& [key, value] : *samples) doc[key] = value;
  if (Status s = WriteJson(f.json, doc); !s.ok()) return Fail(kCmd, s);
  return 0;
}

int Serve(const MetricsFlags& f) {
  if (f.targets.empty())
    return Fail(kCmd, Status(Code::kInvalidArgument, "--serve needs --targets (the engines' metrics addresses)"));
  std::vector<std::pair<std::string, MetricsUrl>> targets;
  for (const std::string& t : f.targets) {
    Result<MetricsUrl> url = ParseMetricsUrl(t);
    if (!url.ok()) return Fail(kCmd, url.status().WithContext("--targets"));
    targets.emplace_back(t, *url);
  }
  const std::string address = f.serve.find(':') == std::string::npos ? "127.0.0.1:" + f.serve : f.serve;
  const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  auto render = [targets, timeout] {
    std::vector<Scrape> scrapes;
    for (const auto& [name, url] : targets) {
      Result<std::string> text = FetchMetrics(url, timeout);
      scrapes.push_back(Scrape{name, text.status(), text.ok() ? std::move(text).value() : std::string()});
    }
    return MergePrometheus(scrapes);
  };
  Result<std::unique_ptr<MetricsHttpServer>> server = MetricsHttpServer::Start(address, render);
  if (!server.ok()) return Fail(kCmd, server.status());
  struct sigaction sa {};
  sa.sa_handler = &OnStop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  fmt::print("ferry metrics: serving http://{}/metrics for {} target(s)\n", (*server)->address(), targets.size());
  std::fflush(stdout);
  while (!g_stop.load()) usleep(50'000);
  return 0;
}

}  // namespace

void AddMetricsCommand(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("metrics", "Print a running engine's /metrics, or serve several engines' as one");
  auto f = std::make_shared<MetricsFlags>();
  cmd->add_option("url", f->url, "The engine's metrics endpoint: HOST:PORT, [V6]:PORT or http://HOST:PORT/PATH");
  cmd->add_option("--serve", f->serve, "Serve GET /metrics on [HOST:]PORT (host 127.0.0.1 unless given; 0 = any port)");
  cmd->add_option("--targets", f->targets, "With --serve: the engines' metrics endpoints to merge")
      ->delimiter(',');
  cmd->add_option("--timeout", f->timeout_s, "Seconds one scrape may take")
      ->check(CLI::Range(0.001, 3600.0))
      ->capture_default_str();
  AddJsonFlag(cmd, &f->json, "the samples, \"name{labels}\" -> value");
  cmd->callback([f, exit_code] {
    if (f->serve.empty() == f->url.empty()) {
      *exit_code = Fail(kCmd, Status(Code::kInvalidArgument, "give either an endpoint to print or --serve"));
      return;
    }
    if (!f->serve.empty() && f->json.given()) {
      *exit_code = Fail(kCmd, Status(Code::kInvalidArgument, "--json prints one endpoint; it does not go with --serve"));
      return;
    }
    *exit_code = f->serve.empty() ? Print(*f) : Serve(*f);
  });
}

}  // namespace ferry::tools
