#include <unistd.h>

#include <fstream>
#include <string>

#include "ferry/descriptors.h"

namespace ferry {

const std::string& LocalHostId() {
  static const std::string id = [] {
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0) name[0] = '\0';
    std::string boot;
    std::ifstream in("/proc/sys/kernel/random/boot_id");
    std::getline(in, boot);
    return std::string(name) + "/" + boot;
  }();
  return id;
}

}  // namespace ferry
