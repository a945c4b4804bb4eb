// A minimal blocking HTTP/1.1 client for the API tests: one request per connection
// (Connection: close), the body de-chunked, so that tests see the exact bytes the server sent.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace litellama::testing {

struct HttpResponse {
  int status = 0;  // 0: no answer
  std::string headers;
  std::string body;
  bool chunked = false;
};

inline int connect_local(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline std::string request_text(const std::string& method, const std::string& path,
                                const std::string& body, const std::vector<std::string>& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (!body.empty() || method == "POST") {
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  }
  return req + "\r\n" + body;
}

// Decodes a chunked body; returns false when it is malformed.
inline bool dechunk(const std::string& in, std::string* out) {
  size_t pos = 0;
  out->clear();
  while (true) {
    const size_t eol = in.find("\r\n", pos);
    if (eol == std::string::npos) return false;
    const size_t n = std::strtoul(in.substr(pos, eol - pos).c_str(), nullptr, 16);
    pos = eol + 2;
    if (n == 0) return true;
    if (pos + n + 2 > in.size()) return false;
    out->append(in, pos, n);
    pos += n + 2;
  }
}

inline HttpResponse parse_response(const std::string& raw) {
  HttpResponse r;
  const size_t sp = raw.find(' ');
  const size_t end = raw.find("\r\n\r\n");
  if (sp == std::string::npos || end == std::string::npos) return r;
  r.status = std::atoi(raw.c_str() + sp + 1);
  r.headers = raw.substr(0, end);
  std::string lower = r.headers;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  r.chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
  r.body = raw.substr(end + 4);
  if (r.chunked) {
    std::string body;
    if (!dechunk(r.body, &body)) return HttpResponse{};
    r.body = std::move(body);
  }
  return r;
}

inline HttpResponse http(int port, const std::string& method, const std::string& path,
                         const std::string& body = "",
                         const std::vector<std::string>& headers = {}) {
  const int fd = connect_local(port);
  if (fd < 0) return {};
  const std::string req = request_text(method, path, body, headers);
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = write(fd, req.data() + sent, req.size() - sent);
    if (n <= 0) break;  // the server may answer (413) and close before reading it all
    sent += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[8192];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof(buf))) > 0) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  return parse_response(raw);
}

}  // namespace litellama::testing
