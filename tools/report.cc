#include "report.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ferry::tools {

LatencySummary Summarize(std::vector<double>& us) {
  LatencySummary s;
  if (us.empty()) return s;
  std::sort(us.begin(), us.end());
  auto at = [&](double q) {
    // Nearest rank: the smallest sample with at least q of the samples at or below it.
    size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(us.size())));
    return us[std::clamp<size_t>(rank, 1, us.size()) - 1];
  };
  s.samples = us.size();
  s.min_us = us.front();
  s.max_us = us.back();
  s.median_us = at(0.5);
  s.p99_us = at(0.99);
  s.mean_us = std::accumulate(us.begin(), us.end(), 0.0) / static_cast<double>(us.size());
  return s;
}

double GigabytesPerSecond(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / 1e9 : 0.0;
}

void Table::AddColumn(std::string title, Align align) {
  titles_.push_back(std::move(title));
  aligns_.push_back(align);
}

void Table::AddRow(std::vector<std::string> cells) {
  cells.resize(titles_.size());
  rows_.push_back(std::move(cells));
}

void Table::Print(std::FILE* out) const {
  std::vector<size_t> width(titles_.size());
  for (size_t c = 0; c < titles_.size(); ++c) {
    width[c] = titles_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) s += "  ";
      s += aligns_[c] == Align::kLeft ? fmt::format("{:<{}}", cells[c], width[c])
                                      : fmt::format("{:>{}}", cells[c], width[c]);
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    fmt::print(out, "{}\n", s);
  };
  line(titles_);
  std::vector<std::string> rule;
  for (size_t w : width) rule.emplace_back(w, '-');
  line(rule);
  for (const auto& row : rows_) line(row);
  std::fflush(out);
}

Progress::Progress(std::string label, size_t total)
    : label_(std::move(label)),
      total_(std::max<size_t>(total, 1)),
      enabled_(isatty(STDERR_FILENO) == 1) {}

void Progress::Step(std::string_view note) { Update(done_ + 1, note); }

void Progress::Update(size_t done, std::string_view note) {
  done_ = std::min(done, total_);
  if (!enabled_) return;
  auto now = std::chrono::steady_clock::now();
  // Redraw at most every 50 ms, and always at the end.
  if (done_ < total_ && now - last_draw_ < std::chrono::milliseconds(50)) return;
  last_draw_ = now;
  Draw(note);
}

void Progress::Draw(std::string_view note) {
  constexpr size_t kWidth = 30;
  size_t filled = kWidth * done_ / total_;
  std::string bar(filled, '#');
  bar.resize(kWidth, '.');
  std::string text = fmt::format("\r{} [{}] {}/{} {}", label_, bar, done_, total_, note);
  if (text.size() > 100) text.resize(100);
  fmt::print(stderr, "{}\033[K", text);
  std::fflush(stderr);
}

void Progress::Done() {
  if (!enabled_) return;
  fmt::print(stderr, "\r\033[K");
  std::fflush(stderr);
  enabled_ = false;
}

}  // namespace ferry::tools
