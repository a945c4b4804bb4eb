#include "common/load_progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace litellama {

namespace {

constexpr int kBarWidth = 30;
// The bar is redrawn at most this often: a terminal write per tensor would cost more than a
// small tensor's copy.
constexpr auto kRedrawInterval = std::chrono::milliseconds(100);

}  // namespace

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.1f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.1f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.1f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

LoadProgress::LoadProgress(std::string what, int64_t total_bytes, int32_t n_shards,
                           Listener listener)
    : LoadProgress(std::move(what), total_bytes, n_shards, std::move(listener),
                   isatty(STDERR_FILENO) == 1) {}

LoadProgress::LoadProgress(std::string what, int64_t total_bytes, int32_t n_shards,
                           Listener listener, bool terminal)
    : what_(std::move(what)),
      total_bytes_(std::max<int64_t>(total_bytes, 0)),
      n_shards_(std::max(n_shards, 1)),
      listener_(std::move(listener)),
      terminal_(terminal),
      start_(std::chrono::steady_clock::now()) {
  report(true);
}

LoadProgress::~LoadProgress() {
  finish();
}

void LoadProgress::add(int64_t bytes, int32_t /*shard*/) {
  if (finished_) return;
  done_bytes_ = std::min(total_bytes_, done_bytes_ + std::max<int64_t>(bytes, 0));
  report(false);
}

void LoadProgress::shard_done(int32_t /*shard*/) {
  if (finished_) return;
  n_shards_done_ = std::min(n_shards_, n_shards_done_ + 1);
  report(n_shards_ > 1);
}

std::string LoadProgress::line() const {
  const int percent = total_bytes_ > 0 ? static_cast<int>(100 * done_bytes_ / total_bytes_) : 100;
  return fmt::format("{}: {:3d}% ({} of {}, shard {} of {})", what_, percent,
                     format_bytes(done_bytes_), format_bytes(total_bytes_),
                     std::min(n_shards_done_ + 1, n_shards_), n_shards_);
}

void LoadProgress::report(bool force) {
  const int tenth = total_bytes_ > 0 ? static_cast<int>(10 * done_bytes_ / total_bytes_) : 10;
  const bool new_tenth = tenth != last_tenth_;
  if (new_tenth || force) {
    last_tenth_ = tenth;
    last_line_ = line();
    if (listener_) listener_(last_line_);
    if (!terminal_) std::fprintf(stderr, "%s\n", last_line_.c_str());
  }
  if (!terminal_) return;
  const auto now = std::chrono::steady_clock::now();
  if (!force && !new_tenth && now - last_draw_ < kRedrawInterval) return;
  last_draw_ = now;
  const int filled =
      total_bytes_ > 0 ? static_cast<int>(kBarWidth * done_bytes_ / total_bytes_) : kBarWidth;
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kBarWidth, '.');
  // \r and erase-to-end-of-line: the bar overwrites itself.
  std::fprintf(stderr, "\r[%s] %s\x1b[K", bar.c_str(), line().c_str());
  std::fflush(stderr);
}

void LoadProgress::finish() {
  if (finished_) return;
  finished_ = true;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  last_line_ = fmt::format("{}: {} from {} shard{} in {:.2f} s", what_, format_bytes(done_bytes_),
                           n_shards_, n_shards_ == 1 ? "" : "s", seconds);
  if (listener_) listener_(last_line_);
  if (terminal_) std::fprintf(stderr, "\r\x1b[K");
  std::fprintf(stderr, "%s\n", last_line_.c_str());
}

}  // namespace litellama
