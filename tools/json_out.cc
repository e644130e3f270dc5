#include "json_out.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace ferry::tools {

void AddJsonFlag(CLI::App* cmd, JsonFlag* flag, std::string_view what) {
  flag->option = cmd->add_option("--json", flag->path,
                                 std::string(what) + " as JSON, to FILE (`-` or none: standard output; "
                                                     "the text report then goes to standard error)")
                     ->expected(0, 1)
                     ->type_name("[FILE]");
}

Status CheckJsonTarget(const JsonFlag& flag) {
  if (!flag.given() || flag.to_stdout()) return Status::Ok();
  const std::string& path = flag.path;
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return Status(Code::kInvalidArgument, "--json " + path + ": folder " + dir + " does not exist");
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) return Status(Code::kInvalidArgument, "--json " + path + " is not a regular file");
    if (::access(path.c_str(), W_OK) != 0)
      return Status(Code::kInvalidArgument, "--json " + path + " is not writable");
  } else if (::access(dir.c_str(), W_OK) != 0) {
    return Status(Code::kInvalidArgument, "--json " + path + ": folder " + dir + " is not writable");
  }
  return Status::Ok();
}

std::FILE* TextStream(const JsonFlag& flag) { return flag.to_stdout() ? stderr : stdout; }

Status WriteJson(const JsonFlag& flag, const nlohmann::ordered_json& doc) {
  if (!flag.given()) return Status::Ok();
  const std::string text = doc.dump(2) + "\n";
  if (flag.to_stdout()) {
    std::fflush(stderr);
    if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size() || std::fflush(stdout) != 0)
      return Status(Code::kUnavailable, "cannot write the JSON to standard output");
    return Status::Ok();
  }
  std::ofstream out(flag.path);
  out << text;
  out.close();
  if (!out) return Status(Code::kUnavailable, "cannot write --json " + flag.path);
  return Status::Ok();
}

}  // namespace ferry::tools
