// The command line's parse errors (cli_errors.h), --json (json_out.h) and --transport
// (transport_flag.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "cli_errors.h"
#include "json_out.h"
#include "transport_flag.h"

namespace ferry::tools {
namespace {

// An app shaped like `ferry`'s: two commands, one with a checked option, one hidden.
struct TestApp {
  CLI::App app{"test"};
  std::string op = "write";
  int ran = 0;
  TestApp() {
    app.require_subcommand(1);
    app.set_version_flag("--version", "9.9");
    CLI::App* bench = app.add_subcommand("bench", "b");
    bench->add_option("--op", op)->check(CLI::IsMember({"write", "read"}));
    bench->callback([this] { ++ran; });
    app.add_subcommand("info", "i")->callback([this] { ++ran; });
    app.add_subcommand("worker", "hidden")->group("");
  }
  std::optional<int> Parse(std::vector<const char*> args, std::string* out = nullptr, std::string* err = nullptr) {
    args.insert(args.begin(), "ferry");
    std::ostringstream o, e;
    auto rc = ParseCommandLine(app, static_cast<int>(args.size()), args.data(), o, e);
    if (out) *out = o.str();
    if (err) *err = e.str();
    return rc;
  }
};

TEST(ParseCommandLine, ParsedRunsTheCommand) {
  TestApp t;
  EXPECT_EQ(t.Parse({"bench", "--op", "read"}), std::nullopt);
  EXPECT_EQ(t.ran, 1);
  EXPECT_EQ(t.op, "read");
}

TEST(ParseCommandLine, EveryParseErrorIsExitTwoAndOneLine) {
  const std::vector<std::vector<const char*>> bad = {
      {}, {"bogus"}, {"bench", "--op", "foo"}, {"bench", "--nope"}, {"info", "extra"}, {"bench", "--op"}};
  for (const auto& args : bad) {
    TestApp t;
    std::string out, err;
    EXPECT_EQ(t.Parse(args, &out, &err), kUsageExit) << (args.empty() ? "(none)" : args[0]);
    EXPECT_EQ(t.ran, 0);
    EXPECT_TRUE(out.empty());
    ASSERT_FALSE(err.empty());
    EXPECT_EQ(err.find('\n'), err.size() - 1) << err;  // one line
  }
}

TEST(ParseCommandLine, LinesNameTheCommandAndTheProblem) {
  std::string err;
  TestApp a;
  a.Parse({"bench", "--op", "foo"}, nullptr, &err);
  EXPECT_EQ(err, "ferry bench: --op: foo not in {write,read} (see `ferry bench --help`)\n");
  TestApp b;
  b.Parse({"bogus"}, nullptr, &err);
  EXPECT_EQ(err, "ferry: unknown command 'bogus' (commands: bench, info; see `ferry --help`)\n");
  TestApp c;
  c.Parse({}, nullptr, &err);
  EXPECT_EQ(err, "ferry: a command is required (bench, info) (see `ferry --help`)\n");
  TestApp d;
  d.Parse({"info", "extra"}, nullptr, &err);
  EXPECT_EQ(err, "ferry info: the following argument was not expected: extra (see `ferry info --help`)\n");
}

TEST(ParseCommandLine, HelpAndVersionAreNotErrors) {
  std::string out, err;
  TestApp a;
  EXPECT_EQ(a.Parse({"--version"}, &out, &err), 0);
  EXPECT_EQ(out, "9.9\n");
  TestApp b;
  EXPECT_EQ(b.Parse({"bench", "--help"}, &out, &err), 0);
  EXPECT_NE(out.find("--op"), std::string::npos) << out;  // the command's help
  EXPECT_TRUE(err.empty());
}

// --json parsed as a command would: bare, `-`, a file.
struct JsonApp {
  CLI::App app{"test"};
  JsonFlag json;
  JsonApp() { AddJsonFlag(&app, &json, "Figures"); }
  void Parse(std::vector<const char*> args) {
    args.insert(args.begin(), "cmd");
    app.parse(static_cast<int>(args.size()), args.data());
  }
};

TEST(JsonFlag, BareOrDashIsStandardOutput) {
  JsonApp none;
  none.Parse({});
  EXPECT_FALSE(none.json.given());
  EXPECT_EQ(TextStream(none.json), stdout);
  JsonApp bare;
  bare.Parse({"--json"});
  EXPECT_TRUE(bare.json.to_stdout());
  EXPECT_EQ(TextStream(bare.json), stderr);
  JsonApp dash;
  dash.Parse({"--json", "-"});
  EXPECT_TRUE(dash.json.to_stdout());
  JsonApp file;
  file.Parse({"--json", "out.json"});
  EXPECT_TRUE(file.json.given());
  EXPECT_FALSE(file.json.to_stdout());
  EXPECT_EQ(TextStream(file.json), stdout);
}

TEST(JsonFlag, WritesTheFileNamed) {
  char dir[] = "/tmp/ferry-json-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/out.json";
  JsonApp a;
  a.Parse({"--json", path.c_str()});
  ASSERT_TRUE(CheckJsonTarget(a.json).ok());
  ASSERT_TRUE(WriteJson(a.json, {{"gbps", 1.5}}).ok());
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in)["gbps"], 1.5);
  ::unlink(path.c_str());
  ::rmdir(dir);
}

TEST(JsonFlag, UnwritableTargetsAreRefusedBeforeTheRun) {
  JsonApp missing;
  missing.Parse({"--json", "/nonexistent-ferry-folder/out.json"});
  EXPECT_EQ(CheckJsonTarget(missing.json).code(), Code::kInvalidArgument);
  JsonApp folder;
  folder.Parse({"--json", "/tmp"});
  EXPECT_EQ(CheckJsonTarget(folder.json).code(), Code::kInvalidArgument);
}

TEST(TransportFlag, UnknownNamesAreRefusedWithTheKnownOnes) {
  const std::vector<std::string> compiled = {"local", "shm", "ucx"};
  EXPECT_TRUE(CheckTransportNames({}, compiled).ok());
  EXPECT_TRUE(CheckTransportNames({"ucx", "shm"}, compiled).ok());
  Status s = CheckTransportNames({"ucx", "foo"}, compiled);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.ToString().find("--transport foo"), std::string::npos) << s.ToString();
  EXPECT_NE(s.ToString().find("local, shm, ucx"), std::string::npos) << s.ToString();
}

TEST(TransportFlag, ShmAloneNeedsSharedMemory) {
  EXPECT_EQ(CheckTransportAlloc({"shm"}, false).code(), Code::kInvalidArgument);
  EXPECT_TRUE(CheckTransportAlloc({"shm"}, true).ok());
  EXPECT_TRUE(CheckTransportAlloc({"shm", "ucx"}, false).ok());
  EXPECT_TRUE(CheckTransportAlloc({}, false).ok());
}

}  // namespace
}  // namespace ferry::tools
