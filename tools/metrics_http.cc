#include "metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>

#include "socket_io.h"

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;

Status Errno(const std::string& what) { return Status(Code::kUnavailable, what + ": " + std::strerror(errno)); }

// "host:port" or "[v6]:port" -> host (no brackets), port.
Status SplitAddress(std::string_view address, std::string* host, uint16_t* port) {
  const std::string text(address);
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) return Status(Code::kInvalidArgument, "'" + text + "' is not host:port");
  std::string h = text.substr(0, colon);
  if (h.front() == '[') {
    if (h.size() < 3 || h.back() != ']') return Status(Code::kInvalidArgument, "bad IPv6 host in '" + text + "'");
    h = h.substr(1, h.size() - 2);
  } else if (h.find(':') != std::string::npos) {
    return Status(Code::kInvalidArgument, "an IPv6 host needs brackets: '" + text + "'");
  }
  const std::string p = text.substr(colon + 1);
  char* end = nullptr;
  const long n = std::strtol(p.c_str(), &end, 10);
  if (p.empty() || *end != '\0' || n < 0 || n > 65535)
    return Status(Code::kInvalidArgument, "bad port in '" + text + "'");
  if (h.size() > 255) return Status(Code::kInvalidArgument, "host too long in '" + text + "'");
  *host = h;
  *port = static_cast<uint16_t>(n);
  return Status::Ok();
}

struct AddrInfoDeleter {
  void operator()(addrinfo* a) const { freeaddrinfo(a); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* out = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out);
  if (rc != 0) return Status(Code::kUnavailable, "cannot resolve '" + host + "': " + gai_strerror(rc));
  return AddrInfoPtr(out);
}

std::string AddressOf(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(a->sin6_port));
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  return std::string(host) + ":" + std::to_string(ntohs(a->sin_port));
}

// Connects to one of `addrs` before `until` (non-blocking connect, then poll).
Result<int> Connect(const addrinfo* addrs, const std::string& what, Clock::time_point until) {
  Status last(Code::kUnavailable, "no address for " + what);
  for (const addrinfo* a = addrs; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      last = Errno("socket");
      continue;
    }
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) return fd;
    if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int r;
      while ((r = poll(&p, 1, PollMillisUntil(until))) < 0 && errno == EINTR) {
      }
      if (r == 0) {
        close(fd);
        return Status(Code::kDeadlineExceeded, "connecting to " + what + " timed out");
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (r > 0 && err == 0) return fd;
      errno = err;
    }
    last = Errno("connecting to " + what);
    close(fd);
  }
  return last;
}

// What the metrics server's and client's sends say when they fail (socket_io.h).
constexpr SendMessages kSendMessages{
    .prefix = "", .deadline = "the peer took no more bytes in time", .woken = "the server stops"};

std::string Response(const char* status, std::string_view type, std::string_view body) {
  return std::string("HTTP/1.0 ") + status + "\r\nContent-Type: " + std::string(type) +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + std::string(body);
}

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return std::string(s);
}

// The end of a sample's "name{labels}" in `line` (npos when the braces or quotes do not close).
size_t SampleKeyEnd(std::string_view line) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ' && line[i] != '\t') ++i;
  if (i == line.size() || line[i] != '{') return i;
  bool quoted = false;
  for (++i; i < line.size(); ++i) {
    if (quoted && line[i] == '\\') {
      ++i;
    } else if (line[i] == '"') {
      quoted = !quoted;
    } else if (!quoted && line[i] == '}') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

std::string Escape(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '\\' || c == '"') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

Result<MetricsUrl> ParseMetricsUrl(std::string_view text) {
  MetricsUrl url;
  std::string_view rest = text;
  if (rest.substr(0, 7) == "http://") rest.remove_prefix(7);
  else if (rest.find("://") != std::string_view::npos)
    return Status(Code::kInvalidArgument, "only http:// is supported: '" + std::string(text) + "'");
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    url.path = std::string(rest.substr(slash));
    rest = rest.substr(0, slash);
  }
  if (url.path.find_first_of(" \r\n") != std::string::npos)
    return Status(Code::kInvalidArgument, "bad path in '" + std::string(text) + "'");
  Status s = SplitAddress(rest, &url.host, &url.port);
  if (!s.ok()) return s;
  if (url.port == 0) return Status(Code::kInvalidArgument, "port 0 in '" + std::string(text) + "'");
  return url;
}

Result<std::string> FetchMetrics(const MetricsUrl& url, std::chrono::milliseconds timeout) {
  const auto until = Clock::now() + timeout;
  const std::string what = (url.host.find(':') != std::string::npos ? "[" + url.host + "]" : url.host) + ":" +
                           std::to_string(url.port);
  FERRY_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(url.host, url.port, false));
  FERRY_ASSIGN_OR_RETURN(int fd, Connect(addrs.get(), what, until));
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  FERRY_RETURN_IF_ERROR(SendAllBy(fd, "GET " + url.path + " HTTP/1.0\r\nHost: " + what +
                                          "\r\nAccept: text/plain\r\nConnection: close\r\n\r\n",
                                  until, kSendMessages));
  std::string reply;
  char buf[16384];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    const int r = poll(&p, 1, PollMillisUntil(until));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("poll");
    if (r == 0) return Status(Code::kDeadlineExceeded, what + " did not answer in time");
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) return Errno("reading from " + what);
    if (n == 0) break;
    if (reply.size() + static_cast<size_t>(n) > kMaxMetricsResponseBytes)
      return Status(Code::kResourceExhausted, what + " sent more than " + std::to_string(kMaxMetricsResponseBytes) +
                                                  " bytes");
    reply.append(buf, static_cast<size_t>(n));
  }
  const size_t head_end = reply.find("\r\n\r\n");
  if (reply.substr(0, 5) != "HTTP/" || head_end == std::string::npos)
    return Status(Code::kInvalidArgument, what + " did not answer with HTTP");
  const size_t sp = reply.find(' ');
  const std::string code = sp == std::string::npos ? "" : reply.substr(sp + 1, 3);
  if (code != "200") {
    const size_t eol = reply.find("\r\n");
    return Status(Code::kUnavailable, what + url.path + " answered '" + reply.substr(0, eol) + "'");
  }
  return reply.substr(head_end + 4);
}

Result<std::map<std::string, double>> ParsePrometheusSamples(std::string_view text) {
  std::map<std::string, double> out;
  size_t line_no = 0;
  while (!text.empty()) {
    const size_t eol = text.find('\n');
    const std::string line = Trim(text.substr(0, eol));
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const size_t key_end = SampleKeyEnd(line);
    if (key_end == std::string::npos || key_end == 0 || key_end >= line.size())
      return Status(Code::kInvalidArgument, "line " + std::to_string(line_no) + " is not a sample: " + line);
    const std::string value = Trim(std::string_view(line).substr(key_end));
    const std::string number = value.substr(0, value.find_first_of(" \t"));  // a timestamp may follow
    char* end = nullptr;
    const double v = std::strtod(number.c_str(), &end);
    if (number.empty() || *end != '\0')
      return Status(Code::kInvalidArgument, "line " + std::to_string(line_no) + " has no number: " + line);
    out[line.substr(0, key_end)] = v;
  }
  return out;
}

std::string MergePrometheus(const std::vector<Scrape>& scrapes) {
  struct Family {
    std::string help, type;
    std::vector<std::string> samples;
  };
  std::vector<std::string> order;
  std::map<std::string, Family> families;
  std::set<std::string> seen;  // sample keys already taken
  auto family = [&](const std::string& name) -> Family& {
    auto [it, added] = families.try_emplace(name);
    if (added) order.push_back(name);
    return it->second;
  };
  for (const Scrape& s : scrapes) {
    if (!s.status.ok()) continue;
    std::string current;  // the family of the last # HELP or # TYPE
    std::string_view text = s.text;
    while (!text.empty()) {
      const size_t eol = text.find('\n');
      const std::string line = Trim(text.substr(0, eol));
      text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
      if (line.empty()) continue;
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
        const std::string rest = line.substr(7);
        current = rest.substr(0, rest.find(' '));
        Family& f = family(current);
        std::string& slot = line[2] == 'H' ? f.help : f.type;
        if (slot.empty()) slot = line;
        continue;
      }
      if (line[0] == '#') continue;
      const size_t key_end = SampleKeyEnd(line);
      if (key_end == std::string::npos) continue;  // malformed: left out rather than passed on
      const std::string key = line.substr(0, key_end);
      const std::string name = key.substr(0, key.find('{'));
      // A sample belongs to the family announced before it when its name extends that one's
      // (ferry_x_seconds_bucket under ferry_x_seconds); else it is a family of its own.
      const std::string& fam = !current.empty() && name.rfind(current, 0) == 0 ? current : name;
      if (seen.insert(key).second) family(fam).samples.push_back(line);
    }
  }
  std::string out;
  for (const std::string& name : order) {
    const Family& f = families[name];
    if (!f.help.empty()) out += f.help + "\n";
    if (!f.type.empty()) out += f.type + "\n";
    for (const std::string& line : f.samples) out += line + "\n";
  }
  out += "# HELP ferry_metrics_target_up 1 when the target's /metrics was scraped, 0 when not\n"
         "# TYPE ferry_metrics_target_up gauge\n";
  for (const Scrape& s : scrapes)
    out += "ferry_metrics_target_up{target=\"" + Escape(s.target) + "\"} " + (s.status.ok() ? "1" : "0") + "\n";
  return out;
}

Result<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(const std::string& address,
                                                                    std::function<std::string()> render) {
  std::string host;
  uint16_t port = 0;
  FERRY_RETURN_IF_ERROR(SplitAddress(address, &host, &port));
  FERRY_ASSIGN_OR_RETURN(AddrInfoPtr addrs, Resolve(host, port, true));
  std::unique_ptr<MetricsHttpServer> s(new MetricsHttpServer());
  s->render_ = std::move(render);
  Status last(Code::kUnavailable, "no address to listen on for " + address);
  for (const addrinfo* a = addrs.get(); a != nullptr && s->listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = Errno("socket");
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      last = Errno("cannot serve metrics on " + address);
      close(fd);
      continue;
    }
    s->listen_fd_ = fd;
  }
  if (s->listen_fd_ < 0) return last;
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  s->address_ = AddressOf(bound);
  s->port_ = std::atoi(s->address_.substr(s->address_.rfind(':') + 1).c_str());
  if (pipe2(s->wake_, O_CLOEXEC) != 0) return Status(Code::kResourceExhausted, std::string("pipe: ") + strerror(errno));
  try {
    s->thread_ = std::thread([p = s.get()] { p->Run(); });
  } catch (const std::system_error& e) {
    return Status(Code::kResourceExhausted, std::string("cannot start the metrics thread: ") + e.what());
  }
  return s;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (thread_.joinable()) {
    const char c = 0;
    (void)!write(wake_[1], &c, 1);
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_[0], wake_[1]})
    if (fd >= 0) close(fd);
}

void MetricsHttpServer::Run() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Serve(fd);
    close(fd);
  }
}

void MetricsHttpServer::Serve(int fd) {
  // The request head, within a second and kMaxMetricsRequestBytes: one client cannot hold
  // the server.
  std::string req;
  const auto until = Clock::now() + std::chrono::seconds(1);
  // The answer, within two seconds: a client that stops reading is dropped.
  const auto answer = [&](const std::string& response) {
    (void)SendAllBy(fd, response, Clock::now() + std::chrono::seconds(2), kSendMessages, wake_[0]);
  };
  char buf[1024];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() >= kMaxMetricsRequestBytes)
      return answer(Response("400 Bad Request", "text/plain", "too large\n"));
    pollfd p[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    const int r = poll(p, 2, PollMillisUntil(until));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || p[1].revents) return;
    const ssize_t n = recv(fd, buf, std::min(sizeof(buf), kMaxMetricsRequestBytes - req.size()), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    req.append(buf, static_cast<size_t>(n));
  }
  const std::string_view head(req.data(), std::min(req.find('\n'), req.size()));
  const size_t sp1 = head.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : head.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || head.substr(0, sp1) != "GET" ||
      head.substr(sp2 + 1, 5) != "HTTP/")
    return answer(Response("400 Bad Request", "text/plain", "bad request\n"));
  const std::string_view path = head.substr(sp1 + 1, sp2 - sp1 - 1);
  if (path != "/metrics" && path != "/")
    return answer(Response("404 Not Found", "text/plain", "not found\n"));
  answer(Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_()));
}

}  // namespace ferry::tools
