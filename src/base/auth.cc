#include "base/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/endian.h"

namespace ferry::internal::auth {

std::string TargetProof(std::string_view secret, std::string_view label, std::string_view initiator_nonce,
                        std::string_view target_nonce, std::string_view initiator, std::string_view target) {
  return Mac(secret, std::string(label) + ": target", {initiator_nonce, target_nonce, target, initiator});
}

std::string InitiatorProof(std::string_view secret, std::string_view label, std::string_view initiator_nonce,
                           std::string_view target_nonce, std::string_view initiator, std::string_view target) {
  return Mac(secret, std::string(label) + ": initiator", {target_nonce, initiator_nonce, initiator, target});
}

Result<std::string> Nonce() {
  std::string n(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(n.data()), static_cast<int>(n.size())) != 1)
    return Status(Code::kInternal, "no randomness for an authentication nonce (RAND_bytes failed)");
  return n;
}

std::string Mac(std::string_view secret, std::string_view label, std::initializer_list<std::string_view> parts) {
  std::string input;
  auto add = [&input](std::string_view p) {
    char len[8];
    StoreLe64(len, p.size());
    input.append(len, sizeof(len));
    input.append(p);
  };
  add(label);
  for (std::string_view p : parts) add(p);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(input.data()),
       input.size(), out, &out_len);
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

bool MacEqual(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Result<std::string> LoadSecret(std::string_view secret, const std::string& secret_file) {
  if (!secret.empty() && !secret_file.empty())
    return Status(Code::kInvalidArgument, "set either secret or secret_file, not both");
  std::string s(secret);
  if (!secret_file.empty()) {
    int fd = open(secret_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status(Code::kInvalidArgument, "secret_file " + secret_file + ": " + std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return Status(Code::kInvalidArgument, "secret_file " + secret_file + " is not a regular file");
    }
    if ((st.st_mode & 077) != 0) {
      close(fd);
      return Status(Code::kInvalidArgument, "secret_file " + secret_file +
                                                " is readable by others (chmod 600 it): the secret is what admits peers");
    }
    if (st.st_size > static_cast<off_t>(kMaxSecretBytes + 2)) {
      close(fd);
      return Status(Code::kInvalidArgument, "secret_file " + secret_file + " is larger than " +
                                                std::to_string(kMaxSecretBytes) + " bytes");
    }
    s.resize(static_cast<size_t>(st.st_size));
    ssize_t n = s.empty() ? 0 : read(fd, s.data(), s.size());
    close(fd);
    if (n < 0) return Status(Code::kInvalidArgument, "reading secret_file " + secret_file + ": " + std::strerror(errno));
    s.resize(static_cast<size_t>(n));
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
    if (s.empty()) return Status(Code::kInvalidArgument, "secret_file " + secret_file + " is empty");
  }
  if (s.empty()) return s;
  if (s.size() < kMinSecretBytes)
    return Status(Code::kInvalidArgument, "the peers' secret has " + std::to_string(s.size()) + " bytes; at least " +
                                              std::to_string(kMinSecretBytes) + " are needed");
  if (s.size() > kMaxSecretBytes)
    return Status(Code::kInvalidArgument, "the peers' secret is longer than " + std::to_string(kMaxSecretBytes) + " bytes");
  return s;
}

}  // namespace ferry::internal::auth
