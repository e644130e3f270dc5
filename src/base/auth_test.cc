#include "base/auth.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

namespace ferry::internal::auth {
namespace {

TEST(Auth, NoncesAreFreshAndMacsDependOnEveryPart) {
  auto a = Nonce(), b = Nonce();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), kNonceBytes);
  EXPECT_NE(*a, *b);
  const std::string secret = "0123456789abcdef-secret";
  const std::string m = Mac(secret, "label", {"x", "yz"});
  EXPECT_EQ(m.size(), kMacBytes);
  EXPECT_EQ(m, Mac(secret, "label", {"x", "yz"}));
  EXPECT_NE(m, Mac(secret, "label", {"xy", "z"}));  // parts are length-prefixed
  EXPECT_NE(m, Mac(secret, "other", {"x", "yz"}));
  EXPECT_NE(m, Mac(secret + "!", "label", {"x", "yz"}));
  EXPECT_TRUE(MacEqual(m, Mac(secret, "label", {"x", "yz"})));
  EXPECT_FALSE(MacEqual(m, m.substr(1)));
}

TEST(Auth, LoadSecretChecksLengthsFilesAndPermissions) {
  EXPECT_EQ(LoadSecret("", "")->size(), 0u);  // no authentication
  EXPECT_EQ(LoadSecret("short", "").status().code(), Code::kInvalidArgument);
  EXPECT_EQ(*LoadSecret("0123456789abcdef", ""), "0123456789abcdef");
  EXPECT_EQ(LoadSecret(std::string(5000, 'x'), "").status().code(), Code::kInvalidArgument);

  char path[] = "/tmp/ferry-secret-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const std::string body = "a-deployment-secret-0123\n";
  ASSERT_EQ(write(fd, body.data(), body.size()), static_cast<ssize_t>(body.size()));
  close(fd);
  ASSERT_EQ(chmod(path, 0600), 0);
  auto s = LoadSecret("", path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, "a-deployment-secret-0123");  // the newline dropped
  EXPECT_EQ(LoadSecret("0123456789abcdef", path).status().code(), Code::kInvalidArgument);  // both
  ASSERT_EQ(chmod(path, 0644), 0);
  auto open = LoadSecret("", path);
  EXPECT_EQ(open.status().code(), Code::kInvalidArgument);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos) << open.status().ToString();
  unlink(path);
  EXPECT_EQ(LoadSecret("", path).status().code(), Code::kInvalidArgument);  // gone
}

}  // namespace
}  // namespace ferry::internal::auth
