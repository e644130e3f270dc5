// EngineOptions from FERRY_* variables (ferry/options.h: EngineOptions::FromEnv). One row of
// kFields per field; the variable is "FERRY_" and the member's path in capitals, '.' as '_'
// (options_env_test checks the rule for every row).
#include "types/options_env.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <limits>
#include <type_traits>

namespace ferry {
namespace {

Status Bad(std::string why) { return Status(Code::kInvalidArgument, std::move(why)); }

std::string Lower(std::string_view v) {
  std::string s(v);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// A whole decimal number in [lo, hi] followed by a suffix (returned in *suffix).
Status ParseNumber(std::string_view v, long double* out, std::string_view* suffix) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || end == v.data()) return Bad("not a number");
  *out = static_cast<long double>(n);
  *suffix = std::string_view(end, static_cast<size_t>(v.data() + v.size() - end));
  return Status::Ok();
}

template <typename T>
Status InRange(long double n, T* out, long double lo = 0) {
  const long double hi = static_cast<long double>(std::numeric_limits<T>::max());
  if (n < lo || n > hi)
    return Bad("out of range (" + std::to_string(static_cast<long long>(lo)) + ".." +
               std::to_string(static_cast<unsigned long long>(hi)) + ")");
  *out = static_cast<T>(n);
  return Status::Ok();
}

Status ParseString(std::string_view v, std::string* out) {
  *out = std::string(v);
  return Status::Ok();
}
std::string FormatString(const std::string& s) { return s; }

Status ParseList(std::string_view v, std::vector<std::string>* out) {
  std::vector<std::string> items;
  while (!v.empty()) {
    const size_t comma = v.find(',');
    std::string_view item = v.substr(0, comma);
    if (item.empty()) return Bad("an empty name in the list");
    items.emplace_back(item);
    if (comma == std::string_view::npos) break;
    v.remove_prefix(comma + 1);
    if (v.empty()) return Bad("an empty name in the list");
  }
  *out = std::move(items);
  return Status::Ok();
}
std::string FormatList(const std::vector<std::string>& l) {
  std::string s;
  for (const auto& i : l) s += (s.empty() ? "" : ",") + i;
  return s;
}

Status ParseUids(std::string_view v, std::vector<uint32_t>* out) {
  std::vector<std::string> items;
  FERRY_RETURN_IF_ERROR(ParseList(v, &items));
  std::vector<uint32_t> uids;
  for (const std::string& item : items) {
    uint32_t uid = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), uid);
    if (ec != std::errc() || end != item.data() + item.size() || uid == UINT32_MAX)
      return Bad("\"" + item.substr(0, 32) + "\" is not a user id");
    uids.push_back(uid);
  }
  *out = std::move(uids);
  return Status::Ok();
}
std::string FormatUids(const std::vector<uint32_t>& l) {
  std::string s;
  for (uint32_t u : l) s += (s.empty() ? "" : ",") + std::to_string(u);
  return s;
}

Status ParseBool(std::string_view v, bool* out) {
  const std::string s = Lower(v);
  if (s == "1" || s == "true") *out = true;
  else if (s == "0" || s == "false") *out = false;
  else return Bad("not a boolean (0, 1, true, false)");
  return Status::Ok();
}
std::string FormatBool(bool b) { return b ? "true" : "false"; }

template <typename T>
Status ParseCount(std::string_view v, T* out) {
  long double n;
  std::string_view suffix;
  FERRY_RETURN_IF_ERROR(ParseNumber(v, &n, &suffix));
  if (!suffix.empty()) return Bad("not a whole number");
  return InRange(n, out);
}
template <typename T>
std::string FormatCount(T n) { return std::to_string(n); }

Status ParseInt(std::string_view v, int* out) {
  long double n;
  std::string_view suffix;
  FERRY_RETURN_IF_ERROR(ParseNumber(v, &n, &suffix));
  if (!suffix.empty()) return Bad("not a whole number");
  return InRange(n, out, static_cast<long double>(std::numeric_limits<int>::min()));
}
std::string FormatInt(int n) { return std::to_string(n); }

template <typename T>
Status ParseBytes(std::string_view v, T* out) {
  long double n;
  std::string_view suffix;
  FERRY_RETURN_IF_ERROR(ParseNumber(v, &n, &suffix));
  const std::string s = Lower(suffix);
  if (s == "k" || s == "kb" || s == "kib") n *= 1024.0L;
  else if (s == "m" || s == "mb" || s == "mib") n *= 1024.0L * 1024;
  else if (s == "g" || s == "gb" || s == "gib") n *= 1024.0L * 1024 * 1024;
  else if (!s.empty()) return Bad("unknown size suffix \"" + std::string(suffix.substr(0, 8)) + "\" (K, M, G)");
  return InRange(n, out);
}
template <typename T>
std::string FormatBytes(T n) { return std::to_string(n); }

template <typename D>
Status ParseDuration(std::string_view v, D* out) {
  long double n;
  std::string_view suffix;
  FERRY_RETURN_IF_ERROR(ParseNumber(v, &n, &suffix));
  if (n < 0) return Bad("a negative duration");
  long double ns;
  const std::string s = Lower(suffix);
  if (s.empty() || s == "ms") ns = n * 1e6L;
  else if (s == "ns") ns = n;
  else if (s == "us") ns = n * 1e3L;
  else if (s == "s") ns = n * 1e9L;
  else if (s == "min") ns = n * 60e9L;
  else return Bad("unknown duration suffix \"" + std::string(suffix.substr(0, 8)) + "\" (ns, us, ms, s, min)");
  const long double ticks = ns * D::period::den / (D::period::num * 1e9L);
  if (ticks != static_cast<long double>(static_cast<int64_t>(ticks)))
    return Bad("finer than the field's unit");
  if (ticks > static_cast<long double>(std::numeric_limits<typename D::rep>::max() / 2))
    return Bad("too long");
  *out = D(static_cast<typename D::rep>(ticks));
  return Status::Ok();
}
template <typename D>
std::string FormatDuration(D d) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
  if (ns % 1'000'000 == 0) return std::to_string(ns / 1'000'000) + "ms";
  if (ns % 1'000 == 0) return std::to_string(ns / 1'000) + "us";
  return std::to_string(ns) + "ns";
}

Status ParseOptDuration(std::string_view v, std::optional<Duration>* out) {
  if (v.empty()) {
    out->reset();
    return Status::Ok();
  }
  Duration d;
  FERRY_RETURN_IF_ERROR(ParseDuration(v, &d));
  *out = d;
  return Status::Ok();
}
std::string FormatOptDuration(const std::optional<Duration>& d) { return d ? FormatDuration(*d) : ""; }

Status ParseEnum(std::string_view v, UcxOptions::Progress* out) {
  const std::string s = Lower(v);
  if (s == "polling") *out = UcxOptions::Progress::kPolling;
  else if (s == "event") *out = UcxOptions::Progress::kEvent;
  else if (s == "shared") *out = UcxOptions::Progress::kShared;
  else return Bad("not polling, event or shared");
  return Status::Ok();
}
std::string FormatEnum(UcxOptions::Progress p) {
  return p == UcxOptions::Progress::kPolling ? "polling" : p == UcxOptions::Progress::kEvent ? "event" : "shared";
}
Status ParseEnum(std::string_view v, UcxOptions::Rma* out) {
  const std::string s = Lower(v);
  if (s == "auto") *out = UcxOptions::Rma::kAuto;
  else if (s == "always") *out = UcxOptions::Rma::kAlways;
  else if (s == "never") *out = UcxOptions::Rma::kNever;
  else return Bad("not auto, always or never");
  return Status::Ok();
}
std::string FormatEnum(UcxOptions::Rma r) {
  return r == UcxOptions::Rma::kAuto ? "auto" : r == UcxOptions::Rma::kAlways ? "always" : "never";
}

#define FERRY_ENV_FIELD(VAR, MEMBER, KIND, VALUES)                                                 \
  EnvField {                                                                                       \
    VAR, #MEMBER, EnvKind::k##KIND, VALUES,                                                        \
        [](EngineOptions& o, std::string_view v) -> Status { return Parse##KIND(v, &o.MEMBER); }, \
        [](const EngineOptions& o) -> std::string { return Format##KIND(o.MEMBER); }               \
  }

// Add a row here for every new EngineOptions field (and docs/configuration.md: options_env_test prints the new table).
const EnvField kFields[] = {
    FERRY_ENV_FIELD("FERRY_KEY", key, String, "text; empty = `<hostname>:<pid>:<random>`"),
    FERRY_ENV_FIELD("FERRY_DEFAULT_DEADLINE", default_deadline, Duration, "duration"),
    FERRY_ENV_FIELD("FERRY_DEREGISTER_TIMEOUT", deregister_timeout, OptDuration, "duration; empty = unset"),
    FERRY_ENV_FIELD("FERRY_WAIT_SPIN", wait_spin, Duration, "duration, 0..1s"),
    FERRY_ENV_FIELD("FERRY_COPY_THREADS", copy_threads, Count, "count; 0 = one per core, at most 8"),
    FERRY_ENV_FIELD("FERRY_PARALLEL_COPY_BYTES", parallel_copy_bytes, Bytes, "size"),
    FERRY_ENV_FIELD("FERRY_PIN_HOST_MEMORY", pin_host_memory, Bool, "boolean"),
    FERRY_ENV_FIELD("FERRY_MERGE_ADJACENT_OPS", merge_adjacent_ops, Bool, "boolean"),
    FERRY_ENV_FIELD("FERRY_TRANSPORTS", transports, List, "names, comma-separated; empty = every usable one"),
    FERRY_ENV_FIELD("FERRY_MAX_NOTIFICATION_BYTES", max_notification_bytes, Bytes, "size"),
    FERRY_ENV_FIELD("FERRY_MAX_PENDING_NOTIFICATIONS", max_pending_notifications, Count, "count"),
    FERRY_ENV_FIELD("FERRY_MAX_PENDING_NOTIFICATION_BYTES", max_pending_notification_bytes, Bytes, "size"),
    FERRY_ENV_FIELD("FERRY_MAX_PENDING_NOTIFICATIONS_PER_PEER", max_pending_notifications_per_peer, Count,
                    "count; 0 = a quarter of max_pending_notifications, at least 64"),
    FERRY_ENV_FIELD("FERRY_METRICS_PORT", metrics_port, Int, "port; 0 = off, -1 = any free port"),
    FERRY_ENV_FIELD("FERRY_SECRET", secret, String, "text, 16+ bytes; empty = peers not authenticated"),
    FERRY_ENV_FIELD("FERRY_SECRET_FILE", secret_file, String, "path of a file only its owner reads"),
    FERRY_ENV_FIELD("FERRY_UCX_LISTEN_HOST", ucx.listen_host, String, "host: IPv4, IPv6 or a name"),
    FERRY_ENV_FIELD("FERRY_UCX_LISTEN_PORT", ucx.listen_port, Count, "port; 0 = any free port"),
    FERRY_ENV_FIELD("FERRY_UCX_MAX_PENDING_HANDSHAKES", ucx.max_pending_handshakes, Count, "count"),
    FERRY_ENV_FIELD("FERRY_UCX_MAX_CONNECTIONS", ucx.max_connections, Count, "count"),
    FERRY_ENV_FIELD("FERRY_UCX_HANDSHAKE_TIMEOUT", ucx.handshake_timeout, Duration, "duration"),
    FERRY_ENV_FIELD("FERRY_UCX_LANES", ucx.lanes, Count, "count"),
    FERRY_ENV_FIELD("FERRY_UCX_WORKERS", ucx.workers, Count, "count, 1..16"),
    FERRY_ENV_FIELD("FERRY_UCX_POST_BATCH", ucx.post_batch, Count, "count"),
    FERRY_ENV_FIELD("FERRY_UCX_PROGRESS", ucx.progress, Enum, "`polling`, `event`, `shared`"),
    FERRY_ENV_FIELD("FERRY_UCX_RMA", ucx.rma, Enum, "`auto`, `always`, `never`"),
    FERRY_ENV_FIELD("FERRY_UCX_MAX_AM_BYTES", ucx.max_am_bytes, Bytes, "size"),
    FERRY_ENV_FIELD("FERRY_UCX_CONNECT_TIMEOUT", ucx.connect_timeout, Duration, "duration"),
    FERRY_ENV_FIELD("FERRY_SHM_REVOKE_TIMEOUT", shm.revoke_timeout, Duration, "duration"),
    FERRY_ENV_FIELD("FERRY_SHM_CALL_TIMEOUT", shm.call_timeout, Duration, "duration"),
    FERRY_ENV_FIELD("FERRY_SHM_MAX_CONNECTIONS", shm.max_connections, Count, "count"),
    FERRY_ENV_FIELD("FERRY_SHM_ALLOWED_UIDS", shm.allowed_uids, Uids, "user ids, comma-separated; empty = same user only"),
};

#undef FERRY_ENV_FIELD

// Longest value read from a variable: options are short; a huge value is a mistake.
constexpr size_t kMaxValueChars = 4096;

Result<EngineOptions> Apply(EngineOptions o, const char* (*lookup)(const char*), std::string_view prefix) {
  for (const EnvField& f : kFields) {
    if (!f.field.starts_with(prefix)) continue;
    const char* raw = lookup(std::string(f.variable).c_str());
    if (raw == nullptr) continue;
    const std::string_view value(raw);
    Status s = value.size() > kMaxValueChars ? Bad("longer than " + std::to_string(kMaxValueChars) + " characters")
                                             : f.set(o, value);
    if (!s.ok()) {
      std::string shown(value.substr(0, 64));
      return Bad(std::string(f.variable) + "=\"" + shown + "\": " + std::string(s.message()));
    }
  }
  return o;
}

const char* GetEnv(const char* name) { return std::getenv(name); }

}  // namespace

std::span<const EnvField> EnvFields() { return kFields; }

Result<EngineOptions> OptionsFromLookup(EngineOptions base, const char* (*lookup)(const char*)) {
  return Apply(std::move(base), lookup, "");
}

std::string EnvTableMarkdown() {
  const EngineOptions defaults;
  std::string t = "| variable | EngineOptions field | value | default |\n| --- | --- | --- | --- |\n";
  for (const EnvField& f : kFields) {
    std::string d = f.get(defaults);
    t += "| `" + std::string(f.variable) + "` | `" + std::string(f.field) + "` | " + std::string(f.values) +
         " | " + (d.empty() ? std::string("(empty)") : "`" + d + "`") + " |\n";
  }
  return t;
}

Result<EngineOptions> EngineOptions::FromEnv() { return FromEnv(EngineOptions()); }

Result<EngineOptions> EngineOptions::FromEnv(const EngineOptions& base) {
  return Apply(base, GetEnv, "");
}

Result<UcxOptions> UcxOptions::FromEnv() { return FromEnv(UcxOptions()); }

Result<UcxOptions> UcxOptions::FromEnv(const UcxOptions& base) {
  EngineOptions o;
  o.ucx = base;
  FERRY_ASSIGN_OR_RETURN(EngineOptions read, Apply(std::move(o), GetEnv, "ucx."));
  return read.ucx;
}

Result<ShmOptions> ShmOptions::FromEnv() { return FromEnv(ShmOptions()); }

Result<ShmOptions> ShmOptions::FromEnv(const ShmOptions& base) {
  EngineOptions o;
  o.shm = base;
  FERRY_ASSIGN_OR_RETURN(EngineOptions read, Apply(std::move(o), GetEnv, "shm."));
  return read.shm;
}

}  // namespace ferry
