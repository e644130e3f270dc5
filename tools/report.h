// Output helpers of the CLI: latency summaries, plain-text tables on stdout and a progress bar
// on stderr (drawn only when stderr is a terminal, so pipes and logs stay clean).
//
// Thread safety: none; each object is used by one thread.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::tools {

struct LatencySummary {
  size_t samples = 0;
  double min_us = 0, median_us = 0, p99_us = 0, max_us = 0, mean_us = 0;
};
// Summarises per-operation latencies given in microseconds (sorts `us`).
LatencySummary Summarize(std::vector<double>& us);

// Bytes over seconds in GB/s (10^9 bytes per second, as memory and network figures are quoted).
double GigabytesPerSecond(double bytes, double seconds);

class Table {
 public:
  enum class Align { kLeft, kRight };
  void AddColumn(std::string title, Align align = Align::kRight);
  // REQUIRES: cells.size() == number of columns
  void AddRow(std::vector<std::string> cells);
  void Print(std::FILE* out) const;

 private:
  std::vector<std::string> titles_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;
};

class Progress {
 public:
  // Draws on stderr when it is a terminal; otherwise every call is a no-op.
  Progress(std::string label, size_t total);
  ~Progress() { Done(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Marks one more step finished; `note` says what runs next.
  void Step(std::string_view note = {});
  void Update(size_t done, std::string_view note = {});
  // Clears the bar.
  void Done();
  bool enabled() const { return enabled_; }

 private:
  void Draw(std::string_view note);

  std::string label_;
  size_t total_;
  size_t done_ = 0;
  bool enabled_;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace ferry::tools
