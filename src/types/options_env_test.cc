#include "types/options_env.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

namespace ferry {
namespace {

// Sets variables for one test and puts back what was there.
class ScopedVars {
 public:
  ~ScopedVars() {
    for (auto& [name, old] : saved_) {
      if (old) ::setenv(name.c_str(), old->c_str(), 1);
      else ::unsetenv(name.c_str());
    }
  }
  void Set(std::string_view name, const std::string& value) {
    std::string n(name);
    if (!saved_.count(n)) {
      const char* old = std::getenv(n.c_str());
      saved_[n] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    ::setenv(n.c_str(), value.c_str(), 1);
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// Inputs of each kind with the value `get` then gives; each field takes the first whose value
// differs from its default.
std::vector<std::pair<std::string, std::string>> Samples(EnvKind kind) {
  switch (kind) {
    case EnvKind::kString: return {{"ferry-env-test", "ferry-env-test"}};
    case EnvKind::kList: return {{"shm,local", "shm,local"}};
    case EnvKind::kUids: return {{"65534,1000", "65534,1000"}};
    case EnvKind::kBool: return {{"FALSE", "false"}, {"1", "true"}};
    case EnvKind::kCount: return {{"7", "7"}, {"3", "3"}};
    case EnvKind::kInt: return {{"-1", "-1"}, {"9", "9"}};
    case EnvKind::kBytes: return {{"3M", "3145728"}, {"2k", "2048"}};
    case EnvKind::kDuration: return {{"2s", "2000ms"}, {"750", "750ms"}};
    case EnvKind::kOptDuration: return {{"1500ms", "1500ms"}};
    case EnvKind::kEnum: return {{"polling", "polling"}, {"always", "always"}, {"never", "never"}};
  }
  return {};
}

std::pair<std::string, std::string> SampleFor(const EnvField& f) {
  const EngineOptions defaults;
  for (auto& [in, out] : Samples(f.kind)) {
    EngineOptions o;
    if (f.set(o, in).ok() && out != f.get(defaults)) return {in, out};
  }
  ADD_FAILURE() << "no sample differs from the default of " << f.variable;
  return {};
}

TEST(OptionsEnvTest, VariableIsTheFieldInCapitals) {
  for (const EnvField& f : EnvFields()) {
    std::string want = "FERRY_";
    for (char c : f.field) want += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(f.variable, want);
  }
}

TEST(OptionsEnvTest, EveryFieldRoundTripsAlone) {
  const EngineOptions defaults;
  for (const EnvField& f : EnvFields()) {
    ScopedVars vars;
    auto [in, out] = SampleFor(f);
    vars.Set(f.variable, in);
    Result<EngineOptions> o = EngineOptions::FromEnv();
    ASSERT_TRUE(o.ok()) << f.variable << ": " << o.status().ToString();
    EXPECT_EQ(f.get(*o), out) << f.variable << "=" << in;
    for (const EnvField& other : EnvFields())
      if (other.variable != f.variable) EXPECT_EQ(other.get(*o), other.get(defaults)) << other.variable;
  }
}

TEST(OptionsEnvTest, AllFieldsAtOnceOverABase) {
  ScopedVars vars;
  std::vector<std::string> want;
  for (const EnvField& f : EnvFields()) {
    auto [in, out] = SampleFor(f);
    vars.Set(f.variable, in);
    want.push_back(out);
  }
  Result<EngineOptions> o = EngineOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  size_t i = 0;
  for (const EnvField& f : EnvFields()) EXPECT_EQ(f.get(*o), want[i++]) << f.variable;
}

TEST(OptionsEnvTest, UnsetVariablesKeepTheBase) {
  EngineOptions base;
  base.key = "from-code";
  base.ucx.lanes = 5;
  ScopedVars vars;
  vars.Set("FERRY_UCX_WORKERS", "2");
  Result<EngineOptions> o = EngineOptions::FromEnv(base);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->ucx.workers, 2);
  if (std::getenv("FERRY_KEY") == nullptr) EXPECT_EQ(o->key, "from-code");
  if (std::getenv("FERRY_UCX_LANES") == nullptr) EXPECT_EQ(o->ucx.lanes, 5);
}

TEST(OptionsEnvTest, NestedFromEnvReadsOnlyItsPrefix) {
  ScopedVars vars;
  vars.Set("FERRY_UCX_LANES", "4");
  vars.Set("FERRY_SHM_CALL_TIMEOUT", "3s");
  vars.Set("FERRY_COPY_THREADS", "not-read-by-ucx");
  Result<UcxOptions> ucx = UcxOptions::FromEnv();
  ASSERT_TRUE(ucx.ok()) << ucx.status().ToString();
  EXPECT_EQ(ucx->lanes, 4);
  Result<ShmOptions> shm = ShmOptions::FromEnv();
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  EXPECT_EQ(shm->call_timeout, std::chrono::seconds(3));
  Result<EngineOptions> all = EngineOptions::FromEnv();
  EXPECT_EQ(all.status().code(), Code::kInvalidArgument);
}

TEST(OptionsEnvTest, BadValuesNameTheVariable) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"FERRY_PIN_HOST_MEMORY", "yes"},        {"FERRY_COPY_THREADS", "-2"},
      {"FERRY_COPY_THREADS", "3x"},            {"FERRY_UCX_LISTEN_PORT", "65536"},
      {"FERRY_PARALLEL_COPY_BYTES", "4T"},     {"FERRY_PARALLEL_COPY_BYTES", ""},
      {"FERRY_DEFAULT_DEADLINE", "2h"},        {"FERRY_DEFAULT_DEADLINE", "-5ms"},
      {"FERRY_UCX_HANDSHAKE_TIMEOUT", "10us"}, {"FERRY_UCX_PROGRESS", "busy"},
      {"FERRY_UCX_RMA", ""},                   {"FERRY_TRANSPORTS", "shm,,ucx"},
      {"FERRY_METRICS_PORT", "99999999999"},   {"FERRY_DEREGISTER_TIMEOUT", "soon"},
      {"FERRY_WAIT_SPIN", "-1us"},
  };
  for (auto [name, value] : bad) {
    ScopedVars vars;
    vars.Set(name, value);
    Result<EngineOptions> o = EngineOptions::FromEnv();
    EXPECT_EQ(o.status().code(), Code::kInvalidArgument) << name << "=" << value;
    EXPECT_NE(o.status().message().find(name), std::string::npos) << o.status().ToString();
  }
}

TEST(OptionsEnvTest, UnitsAndEmptyOptional) {
  ScopedVars vars;
  vars.Set("FERRY_DEFAULT_DEADLINE", "250us");
  vars.Set("FERRY_WAIT_SPIN", "0");
  vars.Set("FERRY_DEREGISTER_TIMEOUT", "");
  vars.Set("FERRY_UCX_MAX_AM_BYTES", "64K");
  vars.Set("FERRY_UCX_CONNECT_TIMEOUT", "1min");
  Result<EngineOptions> o = EngineOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->default_deadline, std::chrono::microseconds(250));
  EXPECT_EQ(o->wait_spin, Duration::zero());
  EXPECT_FALSE(o->deregister_timeout.has_value());
  EXPECT_EQ(o->ucx.max_am_bytes, 64u << 10);
  EXPECT_EQ(o->ucx.connect_timeout, std::chrono::minutes(1));
}

// docs/configuration.md holds EnvTableMarkdown() verbatim, between its two markers.
// The per-peer notification bound reads like the global one; "0" keeps the derived default.
TEST(OptionsEnvTest, PerPeerNotificationBound) {
  EXPECT_EQ(EngineOptions{}.max_pending_notifications_per_peer, 0u);
  ScopedVars vars;
  vars.Set("FERRY_MAX_PENDING_NOTIFICATIONS_PER_PEER", "100");
  Result<EngineOptions> o = EngineOptions::FromEnv();
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->max_pending_notifications_per_peer, 100u);
  vars.Set("FERRY_MAX_PENDING_NOTIFICATIONS_PER_PEER", "-1");
  o = EngineOptions::FromEnv();
  EXPECT_EQ(o.status().code(), Code::kInvalidArgument);
  EXPECT_NE(o.status().message().find("FERRY_MAX_PENDING_NOTIFICATIONS_PER_PEER"), std::string::npos);
}

TEST(OptionsEnvTest, DocsTableMatchesTheList) {
  std::ifstream in(std::string(FERRY_SOURCE_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in) << "docs/configuration.md not found under " << FERRY_SOURCE_DIR;
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  const std::string begin = "<!-- env-table begin: generated by options_env_test -->\n";
  const std::string end = "<!-- env-table end -->";
  const size_t b = readme.find(begin);
  const size_t e = readme.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/configuration.md lacks the marker " << begin;
  ASSERT_NE(e, std::string::npos);
  const std::string table = readme.substr(b + begin.size(), e - b - begin.size());
  EXPECT_EQ(table, EnvTableMarkdown()) << "Replace the table in docs/configuration.md with:\n" << EnvTableMarkdown();
}

TEST(OptionsEnvTest, ShmMaxConnectionsFromEnv) {
  ScopedVars vars;
  EXPECT_EQ(ShmOptions().max_connections, 512u);
  vars.Set("FERRY_SHM_MAX_CONNECTIONS", "7");
  Result<ShmOptions> shm = ShmOptions::FromEnv();
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  EXPECT_EQ(shm->max_connections, 7u);
  vars.Set("FERRY_SHM_MAX_CONNECTIONS", "many");
  EXPECT_EQ(ShmOptions::FromEnv().status().code(), Code::kInvalidArgument);
  vars.Set("FERRY_SHM_MAX_CONNECTIONS", "7");
  vars.Set("FERRY_SHM_ALLOWED_UIDS", "1000,65534");
  shm = ShmOptions::FromEnv();
  ASSERT_TRUE(shm.ok()) << shm.status().ToString();
  EXPECT_EQ(shm->allowed_uids, (std::vector<uint32_t>{1000, 65534}));
  for (const char* bad : {"nobody", "1000,", "-1", "4294967295", "12x"}) {
    vars.Set("FERRY_SHM_ALLOWED_UIDS", bad);
    EXPECT_EQ(ShmOptions::FromEnv().status().code(), Code::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace ferry
