#include "cli/cli_util.h"

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/net/child_process.h"

namespace litellama::cli {

namespace fs = std::filesystem;

std::string assets_dir() {
  if (const char* env = std::getenv("LITELLAMA_ASSETS_DIR"); env && *env) return env;
  return (fs::path(net::executable_dir()).parent_path() / "share" / "litellama" / "assets")
      .lexically_normal()
      .string();
}

Result<std::string> default_model_dir() {
  // share/litellama/{assets,models}: installed, and in the build tree as links to the checkout.
  const fs::path dir = fs::path(assets_dir()).parent_path() / "models" / "default";
  std::error_code ec;
  if (fs::exists(dir / "config.json", ec)) return dir.string();
  return make_error(StatusCode::kNotFound,
                    "the embedded default model is not in '{}' (it ships in the checkout's "
                    "models/default and is installed beside the assets); pass --model DIR",
                    dir.string());
}

Result<std::vector<int32_t>> parse_id_list(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find(',', pos);
    if (end == std::string::npos) end = text.size();
    std::string item = text.substr(pos, end - pos);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    if (item.empty()) {
      return make_error(StatusCode::kInvalidArgument, "empty element in id list '{}'", text);
    }
    char* tail = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &tail, 10);
    if (*tail != '\0' || errno != 0 || v < 0 || v > INT32_MAX) {
      return make_error(StatusCode::kInvalidArgument, "'{}' is not a token id", item);
    }
    ids.push_back(static_cast<int32_t>(v));
    pos = end + 1;
  }
  return ids;
}

CLI::Validator non_negative(const std::string& meaning_of_zero) {
  return CLI::Validator(
      [meaning_of_zero](std::string& value) -> std::string {
        char* tail = nullptr;
        errno = 0;
        const long long v = std::strtoll(value.c_str(), &tail, 10);
        if (value.empty() || *tail != '\0' || errno != 0) return "'" + value + "' is not a number";
        if (v < 0) return "must be 0 (" + meaning_of_zero + ") or more, not " + value;
        return "";
      },
      "INT >= 0");
}

CLI::Validator port_number(int max_port) {
  return CLI::Validator(
      [max_port](std::string& value) -> std::string {
        char* tail = nullptr;
        errno = 0;
        const long long v = std::strtoll(value.c_str(), &tail, 10);
        if (value.empty() || *tail != '\0' || errno != 0 || v < 0 || v > max_port) {
          return "'" + value + "' is not a port: use 1.." + std::to_string(max_port) +
                 ", or 0 for off";
        }
        return "";
      },
      "PORT");
}

int fail(const char* command, const Status& status) {
  std::fprintf(stderr, "litellama %s: error: %s\n", command, status.message().c_str());
  return 1;
}

namespace {
// Largest --image file read (the decoders refuse images of too many pixels first; a server also
// refuses more than its --max-image-bytes).
constexpr int64_t kMaxImageFileBytes = int64_t{1} << 30;
}  // namespace

Result<std::string> read_image_file(const std::string& path) {
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    return make_error(StatusCode::kNotFound, "--image {}: cannot open it", path);
  }
  if (!fs::is_regular_file(status)) {
    return make_error(StatusCode::kInvalidArgument, "--image {}: not a regular file", path);
  }
  const auto size = fs::file_size(path, ec);
  if (ec || static_cast<int64_t>(size) > kMaxImageFileBytes) {
    return make_error(StatusCode::kInvalidArgument, "--image {}: larger than {} bytes", path,
                      kMaxImageFileBytes);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(StatusCode::kNotFound, "--image {}: cannot open it", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return make_error(StatusCode::kDataLoss, "--image {}: cannot read it", path);
  return bytes;
}

}  // namespace litellama::cli
