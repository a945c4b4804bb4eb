#include "cli/bench_http.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>

#include <curl/curl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace litellama::cli {

namespace {

using nlohmann::json;

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string trim_slash(std::string url) {
  while (!url.empty() && url.back() == '/') url.pop_back();
  return url;
}

struct Transfer {
  CURL* easy = nullptr;
  curl_slist* headers = nullptr;
  std::string body;    // request body
  std::string buffer;  // response bytes not yet split into events
  std::string raw;     // the start of a response that is not a stream (errors)
  size_t index = 0;
  double start = 0.0;
  HttpBenchRecord* record = nullptr;
  int32_t n_chunks = 0;
  int32_t usage_tokens = -1;
  bool done = false;  // [DONE] seen

  ~Transfer() {
    if (easy) curl_easy_cleanup(easy);
    if (headers) curl_slist_free_all(headers);
  }
};

// One SSE event of a completions stream.
void on_event(Transfer& t, const std::string& data) {
  if (data == "[DONE]") {
    t.done = true;
    return;
  }
  const json j = json::parse(data, nullptr, false);
  if (!j.is_object()) return;
  if (j.contains("error")) {
    t.record->error = j["error"].value("message", std::string("error in the stream"));
    return;
  }
  if (j.contains("usage") && j["usage"].is_object()) {
    t.usage_tokens = j["usage"].value("completion_tokens", -1);
  }
  if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) return;
  // A chunk is a step's tokens when it has text or no finish_reason: a server may stream a token
  // whose text is held back (an incomplete UTF-8 sequence, a possible stop string) as an empty
  // chunk, and that token counts, as the ZeroMQ path counts chunks with token ids; the chunk that
  // only ends the choice does not.
  const json& c = j["choices"][0];
  const bool has_text = c.contains("text") && c["text"].is_string() &&
                        !c["text"].get_ref<const std::string&>().empty();
  const bool finishing = c.contains("finish_reason") && !c["finish_reason"].is_null();
  if (!has_text && finishing) return;
  const double now = seconds_now() - t.start;
  if (t.n_chunks == 0) {
    t.record->t_first = now;
  } else {
    t.record->itl.push_back(now - t.record->t_last);
  }
  t.record->t_last = now;
  ++t.n_chunks;
}

size_t on_write(char* data, size_t size, size_t n, void* user) {
  auto& t = *static_cast<Transfer*>(user);
  const size_t bytes = size * n;
  t.buffer.append(data, bytes);
  if (t.raw.size() < 4096) t.raw.append(data, std::min(bytes, 4096 - t.raw.size()));
  size_t end;
  while ((end = t.buffer.find("\n\n")) != std::string::npos) {
    const std::string event = t.buffer.substr(0, end);
    t.buffer.erase(0, end + 2);
    if (event.rfind("data: ", 0) == 0) on_event(t, event.substr(6));
  }
  return bytes;
}

size_t on_collect(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
};

void ensure_curl() {
  static CurlGlobal once;
}

// The multi handle's sockets in an epoll set and its one timer (libcurl's multi_socket API), so
// that each wake-up drives only the transfers whose sockets are ready: curl_multi_perform walks
// every transfer at every wake-up, which at concurrency 64 costs the client more than its streams.
struct SocketLoop {
  int epoll_fd = -1;
  CURLM* multi = nullptr;
  double deadline = -1.0;  // curl's timer (seconds_now()); negative: none

  SocketLoop() : epoll_fd(epoll_create1(EPOLL_CLOEXEC)) {}
  ~SocketLoop() {
    if (epoll_fd >= 0) close(epoll_fd);
  }
  SocketLoop(const SocketLoop&) = delete;
  SocketLoop& operator=(const SocketLoop&) = delete;

  static int on_socket(CURL* /*easy*/, curl_socket_t fd, int what, void* user, void* socket_data) {
    auto& loop = *static_cast<SocketLoop*>(user);
    if (what == CURL_POLL_REMOVE) {
      (void)epoll_ctl(loop.epoll_fd, EPOLL_CTL_DEL, fd, nullptr);
      return 0;
    }
    epoll_event ev{};
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) | (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
    ev.data.fd = fd;
    // socket_data is null the first time curl names this socket: it is added, else modified.
    if (socket_data == nullptr) {
      curl_multi_assign(loop.multi, fd, &loop);
      if (epoll_ctl(loop.epoll_fd, EPOLL_CTL_ADD, fd, &ev) == 0) return 0;
    }
    return epoll_ctl(loop.epoll_fd, EPOLL_CTL_MOD, fd, &ev) == 0 ? 0 : -1;
  }
  static int on_timer(CURLM* /*multi*/, long timeout_ms, void* user) {
    static_cast<SocketLoop*>(user)->deadline =
        timeout_ms < 0 ? -1.0 : seconds_now() + static_cast<double>(timeout_ms) / 1000.0;
    return 0;
  }

  void attach(CURLM* m) {
    multi = m;
    curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, &SocketLoop::on_socket);
    curl_multi_setopt(m, CURLMOPT_SOCKETDATA, this);
    curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, &SocketLoop::on_timer);
    curl_multi_setopt(m, CURLMOPT_TIMERDATA, this);
  }

  // Waits for ready sockets up to wait_ms, or until curl's timer is due, and drives them (curl
  // also runs every expired timer of its own in each call).
  void run_once(int wait_ms) {
    if (deadline >= 0.0) {
      const double left_ms = (deadline - seconds_now()) * 1000.0;
      wait_ms = std::clamp(static_cast<int>(std::ceil(left_ms)), 0, wait_ms);
    }
    epoll_event events[64];
    const int n = epoll_wait(epoll_fd, events, 64, wait_ms);
    int running = 0;
    for (int i = 0; i < n; ++i) {
      const int mask = (events[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
                       (events[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
                       (events[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(multi, events[i].data.fd, mask, &running);
    }
    if (deadline >= 0.0 && seconds_now() >= deadline) {
      deadline = -1.0;
      curl_multi_socket_action(multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
  }
};

}  // namespace

Result<std::string> http_first_model(const std::string& base_url, const std::string& api_key) {
  ensure_curl();
  std::unique_ptr<CURL, void (*)(CURL*)> easy(curl_easy_init(), curl_easy_cleanup);
  std::string body;
  const std::string url = trim_slash(base_url) + "/models";
  curl_slist* headers = nullptr;
  if (!api_key.empty())
    headers = curl_slist_append(headers, ("Authorization: Bearer " + api_key).c_str());
  curl_easy_setopt(easy.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(easy.get(), CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(easy.get(), CURLOPT_WRITEFUNCTION, &on_collect);
  curl_easy_setopt(easy.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(easy.get(), CURLOPT_TIMEOUT_MS, 10000L);
  const CURLcode rc = curl_easy_perform(easy.get());
  long status = 0;
  curl_easy_getinfo(easy.get(), CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    return make_error(StatusCode::kUnavailable, "GET {}: {}", url, curl_easy_strerror(rc));
  }
  const json j = json::parse(body, nullptr, false);
  if (status != 200 || !j.is_object() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].contains("id")) {
    return make_error(StatusCode::kUnavailable, "GET {} answered {}: {}", url, status,
                      body.substr(0, 300));
  }
  return j["data"][0]["id"].get<std::string>();
}

Result<double> run_http_load(const std::string& base_url, const std::string& api_key,
                             const std::string& model,
                             const std::vector<HttpBenchRequest>& requests,
                             const std::vector<double>& arrivals, int32_t concurrency,
                             int32_t timeout_ms, std::vector<HttpBenchRecord>* records) {
  ensure_curl();
  const std::string url = trim_slash(base_url) + "/completions";
  records->assign(requests.size(), HttpBenchRecord{});
  CURLM* multi = curl_multi_init();
  curl_multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, 0L);
  SocketLoop loop;
  if (loop.epoll_fd < 0) {
    curl_multi_cleanup(multi);
    return make_error(StatusCode::kUnavailable, "epoll_create1: {}", std::strerror(errno));
  }
  loop.attach(multi);
  std::vector<std::unique_ptr<Transfer>> transfers(requests.size());
  size_t next = 0, n_done = 0, n_in_flight = 0;
  const double start = seconds_now();
  double last_progress = 0.0;
  Status failure = Status::ok();
  while (n_done < requests.size()) {
    const double now = seconds_now() - start;
    while (next < requests.size() && arrivals[next] <= now &&
           (concurrency <= 0 || n_in_flight < static_cast<size_t>(concurrency))) {
      auto t = std::make_unique<Transfer>();
      const HttpBenchRequest& r = requests[next];
      json body = {{"model", model},
                   {"prompt", r.prompt_ids},
                   {"max_tokens", r.max_tokens},
                   {"ignore_eos", true},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}},
                   {"temperature", r.sampling.temperature},
                   {"top_p", r.sampling.top_p},
                   {"seed", r.sampling.seed & 0x7fffffffffffffffull}};
      if (r.sampling.top_k > 0) body["top_k"] = r.sampling.top_k;
      t->body = body.dump();
      t->index = next;
      t->start = start;
      t->record = &(*records)[next];
      t->record->t_submit = now;
      t->easy = curl_easy_init();
      t->headers = curl_slist_append(t->headers, "Content-Type: application/json");
      if (!api_key.empty()) {
        t->headers = curl_slist_append(t->headers, ("Authorization: Bearer " + api_key).c_str());
      }
      curl_easy_setopt(t->easy, CURLOPT_URL, url.c_str());
      curl_easy_setopt(t->easy, CURLOPT_HTTPHEADER, t->headers);
      curl_easy_setopt(t->easy, CURLOPT_POSTFIELDS, t->body.c_str());
      curl_easy_setopt(t->easy, CURLOPT_POSTFIELDSIZE, static_cast<long>(t->body.size()));
      curl_easy_setopt(t->easy, CURLOPT_WRITEFUNCTION, &on_write);
      curl_easy_setopt(t->easy, CURLOPT_WRITEDATA, t.get());
      curl_easy_setopt(t->easy, CURLOPT_PRIVATE, t.get());
      curl_easy_setopt(t->easy, CURLOPT_TCP_NODELAY, 1L);
      curl_multi_add_handle(multi, t->easy);
      transfers[next] = std::move(t);
      ++next;
      ++n_in_flight;
    }
    int n_msgs = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi, &n_msgs)) {
      if (msg->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &t);
      long status = 0;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
      HttpBenchRecord& rec = *t->record;
      if (msg->data.result != CURLE_OK) {
        rec.error = curl_easy_strerror(msg->data.result);
      } else if (status != 200) {
        rec.error = fmt::format("HTTP {}: {}", status, t->raw.substr(0, 300));
      } else if (rec.error.empty() && !t->done) {
        rec.error = "the stream ended without data: [DONE]";
      }
      rec.ok = rec.error.empty();
      rec.n_output = t->usage_tokens >= 0 ? t->usage_tokens : t->n_chunks;
      if (rec.ok && t->n_chunks == 0) {
        rec.ok = false;
        rec.error = "no tokens arrived";
      }
      curl_multi_remove_handle(multi, msg->easy_handle);
      transfers[t->index].reset();
      ++n_done;
      --n_in_flight;
    }
    // A request due now (the one that just finished freed its place) starts at once: no wait.
    const bool startable = next < requests.size() && arrivals[next] <= seconds_now() - start &&
                           (concurrency <= 0 || n_in_flight < static_cast<size_t>(concurrency));
    int wait_ms = startable ? 0 : 20;
    if (!startable && next < requests.size() && arrivals[next] > now) {
      wait_ms = std::clamp(static_cast<int>((arrivals[next] - now) * 1000), 0, 20);
    }
    if (n_in_flight > 0) {
      loop.run_once(wait_ms);
    } else if (wait_ms > 0 && next < requests.size()) {
      struct timespec ts = {0, wait_ms * 1000000L};
      nanosleep(&ts, nullptr);
    }
    if (now - last_progress > 0.5 || n_done == requests.size()) {
      last_progress = now;
      std::fprintf(stderr, "\rbench: %zu/%zu requests done", n_done, requests.size());
    }
    if (now * 1000 > timeout_ms) {
      failure = Status(StatusCode::kUnavailable, "timed out");
      break;
    }
  }
  std::fprintf(stderr, "\n");
  for (auto& t : transfers) {
    if (t) curl_multi_remove_handle(multi, t->easy);
  }
  transfers.clear();
  curl_multi_cleanup(multi);
  if (!failure) return failure;
  return seconds_now() - start;
}

}  // namespace litellama::cli
