#include "services/api/local_media.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

namespace litellama::api {

namespace {

constexpr const char* kFlag = "--allowed-local-media-path";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The absolute path a file:// URL names.
Result<std::string> path_of_file_url(std::string_view url) {
  constexpr std::string_view kScheme = "file://";
  bool scheme = url.size() >= kScheme.size();
  for (size_t i = 0; scheme && i < kScheme.size(); ++i) {
    scheme = std::tolower(static_cast<unsigned char>(url[i])) == kScheme[i];
  }
  if (!scheme) return make_error(StatusCode::kInvalidArgument, "the URL is not a file:// URL");
  std::string_view rest = url.substr(kScheme.size());
  if (rest.rfind("localhost/", 0) == 0) rest.remove_prefix(std::string_view("localhost").size());
  if (rest.empty() || rest.front() != '/') {
    return make_error(StatusCode::kInvalidArgument,
                      "a file:// URL must name an absolute path on this host (file:///path)");
  }
  if (rest.find_first_of("?#") != std::string_view::npos) {
    return make_error(StatusCode::kInvalidArgument,
                      "a file:// URL takes no query or fragment (write '?' and '#' in a name as "
                      "%3F and %23)");
  }
  std::string path;
  path.reserve(rest.size());
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] != '%') {
      path.push_back(rest[i]);
      continue;
    }
    const int hi = i + 2 < rest.size() ? hex_value(rest[i + 1]) : -1;
    const int lo = i + 2 < rest.size() ? hex_value(rest[i + 2]) : -1;
    if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
      return make_error(StatusCode::kInvalidArgument,
                        "the file:// URL has a bad percent-escape (or an escaped NUL)");
    }
    path.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return path;
}

// Whether `path` (absolute, normal) is `dir` itself or lies under it.
bool is_under(const std::string& path, const std::string& dir) {
  if (dir == "/" || path == dir) return true;
  return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

std::string normal(const std::string& path) {
  std::string out = std::filesystem::path(path).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

Status outside() {
  return make_error(StatusCode::kInvalidArgument,
                    "the file:// URL names a file outside the directory the server reads images "
                    "from ({})",
                    kFlag);
}

// Closes a descriptor on every path out.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

Result<LocalMediaDir> open_local_media_dir(const std::string& dir) {
  if (dir.empty()) return make_error(StatusCode::kInvalidArgument, "{} is empty", kFlag);
  std::error_code ec;
  const std::filesystem::path absolute = std::filesystem::absolute(dir, ec);
  char* real = ec ? nullptr : realpath(absolute.c_str(), nullptr);
  if (real == nullptr) {
    return make_error(StatusCode::kInvalidArgument, "{} {}: {}", kFlag, dir,
                      ec ? ec.message() : std::strerror(errno));
  }
  LocalMediaDir out;
  out.path = normal(absolute.string());
  out.real_path = real;
  std::free(real);
  struct stat st {};
  if (stat(out.real_path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return make_error(StatusCode::kInvalidArgument, "{} {}: not a directory", kFlag, dir);
  }
  return out;
}

Result<std::string> read_local_media(const std::string& url, const LocalMediaDir& dir,
                                     int64_t max_bytes) {
  LITELLAMA_ASSIGN_OR_RETURN(std::string given, path_of_file_url(url));
  // Outside the directory as written: refused without asking the file system, so that a client
  // learns nothing of files elsewhere.
  const std::string path = normal(given);
  if (!is_under(path, dir.path) && !is_under(path, dir.real_path)) return outside();
  char* resolved = realpath(path.c_str(), nullptr);
  if (resolved == nullptr) {
    if (errno == ENOENT || errno == ENOTDIR) {
      return make_error(StatusCode::kInvalidArgument,
                        "the file:// URL names no file under the directory the server reads "
                        "images from ({})",
                        kFlag);
    }
    return make_error(StatusCode::kUnavailable, "the file the file:// URL names cannot be read: {}",
                      std::strerror(errno));
  }
  const std::string real = resolved;
  std::free(resolved);
  if (!is_under(real, dir.real_path)) return outside();  // a symlink leads out
  struct stat st {};
  if (stat(real.c_str(), &st) != 0) {
    return make_error(StatusCode::kUnavailable, "the file the file:// URL names cannot be read: {}",
                      std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return make_error(StatusCode::kInvalidArgument,
                      "the file:// URL names something that is not a regular file");
  }
  Fd file;
  // No symlink at the end (the real path has none unless one was swapped in), no blocking open.
  file.fd = open(real.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
  if (file.fd < 0) {
    if (errno == ELOOP) return outside();
    return make_error(StatusCode::kUnavailable, "the file the file:// URL names cannot be read: {}",
                      std::strerror(errno));
  }
  struct stat opened {};
  if (fstat(file.fd, &opened) != 0 || !S_ISREG(opened.st_mode)) {
    return make_error(StatusCode::kInvalidArgument,
                      "the file:// URL names something that is not a regular file");
  }
  // The descriptor's own path: a directory on the way swapped for a symlink after realpath would
  // show here. Without /proc, the file must be the one stat saw.
  char link[4096];
  const std::string fd_path = "/proc/self/fd/" + std::to_string(file.fd);
  const ssize_t n_link = readlink(fd_path.c_str(), link, sizeof(link) - 1);
  if (n_link > 0) {
    if (!is_under(std::string(link, static_cast<size_t>(n_link)), dir.real_path)) return outside();
  } else if (opened.st_dev != st.st_dev || opened.st_ino != st.st_ino) {
    return outside();
  }
  if (opened.st_size > max_bytes) {
    return make_error(StatusCode::kResourceExhausted,
                      "the image file is {} bytes, over the limit of {} bytes (--max-image-bytes)",
                      static_cast<int64_t>(opened.st_size), max_bytes);
  }
  std::string bytes;
  bytes.resize(static_cast<size_t>(opened.st_size) + 1);
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = read(file.fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return make_error(StatusCode::kUnavailable,
                        "the file the file:// URL names cannot be read: {}", std::strerror(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
    if (got == bytes.size() && static_cast<int64_t>(bytes.size()) <= max_bytes) {
      bytes.resize(std::min<size_t>(bytes.size() * 2, static_cast<size_t>(max_bytes) + 1));
    }
  }
  if (static_cast<int64_t>(got) > max_bytes) {
    return make_error(StatusCode::kResourceExhausted,
                      "the image file is over the limit of {} bytes (--max-image-bytes)",
                      max_bytes);
  }
  bytes.resize(got);
  if (bytes.empty()) {
    return make_error(StatusCode::kInvalidArgument,
                      "the image file the file:// URL names is empty");
  }
  return bytes;
}

}  // namespace litellama::api
