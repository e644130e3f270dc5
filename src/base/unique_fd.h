// UniqueFd: owns one file descriptor and closes it (through the OS seam) when it goes.
//
// Thread safety: a value; one object is not to be used from two threads at once.
#pragma once

#include <utility>

#include "base/os.h"

namespace ferry::os {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~UniqueFd() { reset(); }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives the descriptor up to the caller, who closes it.
  int release() { return std::exchange(fd_, -1); }
  void reset() {
    if (fd_ >= 0) (void)Env::Current()->Close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

}  // namespace ferry::os
