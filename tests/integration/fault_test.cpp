// Faults an operator or an attacker can cause: a second worker or scheduler on one run dir, poison
// prompts, tokenizers that die holding work, unsafe run dirs and endpoints, clients with nothing
// to talk to, and malformed requests. Each test names the defect it guards against.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <regex>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "common/net/run_dir.h"
#include "common/proto/client_messages.h"
#include "common/proto/tokenizer_messages.h"
#include "tests/integration/service_cluster.h"
#include "tests/support/raw_message.h"

namespace litellama {
namespace {

using testing::metric_value;
using testing::ServiceCluster;

struct CommandResult {
  int rc = -1;
  std::string output;  // stdout and stderr
  double seconds = 0.0;
};

// Runs a shell command line; `timeout` bounds it (rc 124 when it ran out).
CommandResult run_command(const std::string& command, int timeout_seconds = 30) {
  CommandResult result;
  const auto start = std::chrono::steady_clock::now();
  const std::string line =
      "timeout -s KILL " + std::to_string(timeout_seconds) + " " + command + " 2>&1";
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return result;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) result.output.append(buf, n);
  const int status = pclose(pipe);
  result.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

// Polls until the process exits (its status) or timeout_ms passes (nullopt).
std::optional<int> wait_exit(net::ChildProcess& p, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto code = p.poll()) return code;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return std::nullopt;
}

proto::GenerateRequest ids_request(int32_t max_tokens) {
  proto::GenerateRequest req;
  req.prompt_ids = {128000, 9906, 11, 1268};
  req.max_tokens = max_tokens;
  req.ignore_eos = true;
  return req;
}

// One request to its end through `client`; the error message, or "" on success.
std::string generate_error(net::SchedulerClient& client, proto::GenerateRequest req,
                           int timeout_ms = 30000) {
  auto done = client.generate(std::move(req), nullptr, timeout_ms);
  return done.is_ok() ? std::string() : done.status().message();
}

int32_t model_context(const ServiceCluster& cluster) {
  std::ifstream f(cluster.model_dir() + "/config.json");
  return nlohmann::json::parse(f).at("max_position_embeddings").get<int32_t>();
}

// A raw DEALER on the client socket, for messages SchedulerClient would never send.
class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void send(const std::string& bytes) { socket_.send(zmq::buffer(bytes), zmq::send_flags::none); }
  void send_two_frames(const std::string& a, const std::string& b) {
    socket_.send(zmq::buffer(a), zmq::send_flags::sndmore);
    socket_.send(zmq::buffer(b), zmq::send_flags::none);
  }
  // The next request_error within timeout_ms; chunks are skipped, final chunks of `final_of`
  // counted in *n_final_chunks (and with stop_at_final, the first one ends the wait).
  std::optional<proto::RequestError> next_error(int timeout_ms, int* n_final_chunks = nullptr,
                                                uint64_t final_of = 0, bool stop_at_final = false) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      zmq::message_t msg;
      if (!socket_.recv(msg, zmq::recv_flags::none)) continue;
      const std::string_view bytes(static_cast<const char*>(msg.data()), msg.size());
      if (auto error = proto::decode<proto::RequestError>(bytes)) return *error;
      if (auto chunk = proto::decode<proto::GenerateChunk>(bytes)) {
        if (n_final_chunks && chunk->finished && chunk->request_id == final_of) {
          ++*n_final_chunks;
          if (stop_at_final) return std::nullopt;
        }
      }
    }
    return std::nullopt;
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

// A msgpack map {v, type, request_id, max_tokens: "many"} (a string where an int belongs).
std::string generate_request_with_string_max_tokens(uint32_t version, uint64_t request_id) {
  return testing::pack_raw_message(4, version, "generate_request", [&](testing::RawPacker& packer) {
    packer.pack(std::string("request_id"));
    packer.pack(request_id);
    packer.pack(std::string("max_tokens"));
    packer.pack(std::string("many"));
  });
}

// ---- 1: two workers on one scheduler ----------------------------------------------------------

TEST(Fault, SecondWorkerWaitsAsStandbyAndTheFirstKeepsServing) {
  ServiceCluster cluster;
  cluster.start_all();
  auto client = cluster.client();
  ASSERT_EQ(generate_error(*client, ids_request(4)), "") << cluster.logs();

  const int second_port = testing::free_tcp_port();
  cluster.start_process("worker2", cluster.worker_argv(second_port));
  // Until it is loaded and heartbeating as ready, then a few peer timeouts more.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline &&
         cluster.log("worker2").find("worker: loaded") == std::string::npos) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));

  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(generate_error(*client, ids_request(8), 10000), "") << cluster.log("scheduler");
  }
  const std::string metrics = cluster.scheduler_metrics();
  EXPECT_EQ(metric_value(metrics, "litellama_scheduler_worker_lost_total"), 0)
      << cluster.log("scheduler");
  EXPECT_EQ(metric_value(metrics, "litellama_scheduler_worker_up"), 1);
  EXPECT_EQ(metric_value(metrics, "litellama_scheduler_workers_refused_total"), 1);
  const auto ready = testing::http_get(second_port, "/ready");
  EXPECT_EQ(ready.first, 503);
  EXPECT_NE(ready.second.find("standby"), std::string::npos) << ready.second;

  // The standby takes over once the serving worker is gone.
  cluster.process("worker").signal(SIGKILL);
  ASSERT_TRUE(wait_exit(cluster.process("worker"), 5000).has_value());
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_worker_up", 1, 10000));
  std::string error = "not tried";
  const auto takeover_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!error.empty() && std::chrono::steady_clock::now() < takeover_deadline) {
    error = generate_error(*client, ids_request(4), 5000);
    if (!error.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(error, "") << cluster.log("scheduler");
  EXPECT_EQ(testing::http_get(second_port, "/ready").first, 200);
}

// ---- 2: a second scheduler on one run dir ------------------------------------------------------

TEST(Fault, SecondSchedulerOnTheRunDirIsRefusedAndTheFirstServesOn) {
  ServiceCluster cluster;
  cluster.start_all();
  cluster.start_process("scheduler2",
                        {cluster.bin_dir() + "/litellama-scheduler", "--run-dir", cluster.run_dir(),
                         "--metrics", "", "--heartbeat-ms", "50", "--peer-timeout-ms", "600"});
  const auto code = wait_exit(cluster.process("scheduler2"), 10000);
  ASSERT_TRUE(code.has_value()) << "the second scheduler kept running on the same sockets";
  EXPECT_EQ(*code, net::kExitConfigError);
  EXPECT_NE(cluster.log("scheduler2").find("is already served by another process"),
            std::string::npos)
      << cluster.log("scheduler2");
  auto client = cluster.client();
  EXPECT_EQ(generate_error(*client, ids_request(4)), "") << cluster.logs();

  // `litellama serve` on that run dir refuses before starting anything.
  const CommandResult serve =
      run_command(cluster.bin_dir() + "/litellama serve --model " + cluster.model_dir() +
                      " --run-dir " + cluster.run_dir() + " --metrics-port 0 --port 0",
                  30);
  EXPECT_NE(serve.rc, 0);
  EXPECT_NE(serve.output.find("already served by another process"), std::string::npos)
      << serve.output;
  EXPECT_EQ(generate_error(*client, ids_request(4)), "") << cluster.logs();
}

TEST(Fault, StaleSocketFilesOfADeadSchedulerAreReplaced) {
  ServiceCluster cluster;
  cluster.make_model();
  std::filesystem::create_directories(cluster.run_dir());
  std::filesystem::permissions(cluster.run_dir(), std::filesystem::perms(0750));
  // Socket files nobody listens on, as a killed scheduler leaves them.
  for (const char* name : {"client", "worker", "tokenizer"}) {
    const std::string path = cluster.run_dir() + "/" + name + ".sock";
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    close(fd);
    ASSERT_TRUE(std::filesystem::exists(path));
  }
  cluster.start_scheduler();
  cluster.start_worker();
  cluster.start_tokenizer();
  cluster.wait_ready();
  auto client = cluster.client();
  EXPECT_EQ(generate_error(*client, ids_request(4)), "") << cluster.logs();
}

// ---- 3: poison prompts and tokenizers that die holding work ------------------------------------

TEST(Fault, PromptOverTheByteLimitFailsAloneAtOnce) {
  ServiceCluster cluster;
  cluster.start_all();
  auto client = cluster.client();
  proto::GenerateRequest huge;
  huge.prompt = std::string(size_t{5} << 20, 'a');
  huge.max_tokens = 4;
  const auto t0 = std::chrono::steady_clock::now();
  auto id = client->submit(huge);
  ASSERT_TRUE(id.is_ok());
  auto small_id = client->submit(ids_request(4));
  ASSERT_TRUE(small_id.is_ok());
  std::string huge_error;
  bool small_ok = false;
  int n_done = 0;
  while (n_done < 2 && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    auto event = client->next_event(100);
    if (!event.is_ok() || !*event) continue;
    const auto& e = **event;
    if (e.request_id() == *id && e.kind == net::ClientEvent::Kind::kError) {
      huge_error = e.error.message;
      ++n_done;
    } else if (e.request_id() == *id) {
      ++n_done;  // it must not succeed
    } else if (e.request_id() == *small_id) {
      if (e.kind == net::ClientEvent::Kind::kError) ++n_done;
      if (e.kind == net::ClientEvent::Kind::kChunk && e.chunk.finished) {
        small_ok = true;
        ++n_done;
      }
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(huge_error.find("bytes, over the limit of 4194304 bytes"), std::string::npos)
      << huge_error;
  EXPECT_TRUE(small_ok) << cluster.logs();
  EXPECT_LT(seconds, 10.0);
  EXPECT_EQ(cluster.log("scheduler").find("tokenizer lost"), std::string::npos);
}

TEST(Fault, SlowEncodeFailsAloneByItsBudgetWhileHeartbeatsGoOn) {
  ServiceCluster cluster;
  cluster.add_scheduler_args({"--encode-timeout-ms", "200"});
  cluster.start_all();
  auto client = cluster.client();
  // Just under the byte limit, of words unlike each other: seconds of BPE merges.
  std::mt19937 gen(3);
  std::string text;
  while (text.size() < (size_t{4} << 20) - 64) {
    const int n = 3 + static_cast<int>(gen() % 9);
    for (int i = 0; i < n; ++i) text.push_back(static_cast<char>('a' + gen() % 26));
    text.push_back(' ');
  }
  proto::GenerateRequest slow;
  slow.prompt = text;
  slow.max_tokens = 4;
  const std::string error = generate_error(*client, slow, 60000);
  EXPECT_NE(error.find("tokenizing the prompt took longer than 200 ms"), std::string::npos)
      << error << "\n"
      << cluster.log("scheduler");
  // The tokenizer stayed up throughout (its heartbeats do not wait for the encode), and the
  // service answers the next request once the tokenizer is free.
  EXPECT_EQ(generate_error(*client, ids_request(4), 60000), "") << cluster.logs();
  EXPECT_EQ(cluster.log("scheduler").find("tokenizer lost"), std::string::npos)
      << cluster.log("scheduler");
}

TEST(Fault, RequestWhoseTokenizersKeepDyingFailsAfterTheRetryLimit) {
  ServiceCluster cluster;
  cluster.make_model();
  cluster.start_scheduler();
  auto client = cluster.client();
  proto::GenerateRequest req;
  req.prompt = "a prompt that kills every tokenizer it is sent to";
  req.max_tokens = 4;
  auto id = client->submit(req);
  ASSERT_TRUE(id.is_ok());
  // Fake tokenizers that each take the encode and die without answering.
  int n_killed = 0;
  std::optional<proto::RequestError> error;
  for (int round = 0; round < 8 && !error; ++round) {
    zmq::context_t context(1);
    zmq::socket_t tok(context, zmq::socket_type::dealer);
    tok.set(zmq::sockopt::linger, 0);
    tok.set(zmq::sockopt::routing_id, "tokenizer-fake-" + std::to_string(round));
    tok.connect(cluster.endpoint("tokenizer"));
    proto::TokenizerHeartbeat hb;
    hb.incarnation = 1000 + static_cast<uint64_t>(round);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool got_encode = false;
    while (!got_encode && std::chrono::steady_clock::now() < deadline) {
      tok.send(zmq::buffer(proto::encode(hb)), zmq::send_flags::dontwait);
      zmq::pollitem_t item{tok.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      zmq::message_t msg;
      while (tok.recv(msg, zmq::recv_flags::dontwait)) {
        const std::string_view bytes(static_cast<const char*>(msg.data()), msg.size());
        if (proto::decode<proto::EncodeRequest>(bytes).is_ok()) got_encode = true;
      }
    }
    tok.close();  // dies holding the encode
    if (got_encode) ++n_killed;
    // The scheduler notices on its next heartbeat and re-sends, or gives up.
    const auto wait_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
    while (!error && std::chrono::steady_clock::now() < wait_until) {
      auto event = client->next_event(50);
      if (event.is_ok() && *event && (*event)->kind == net::ClientEvent::Kind::kError) {
        error = (*event)->error;
      }
    }
  }
  ASSERT_TRUE(error.has_value()) << n_killed << " tokenizers died on the request and it is "
                                 << "still being re-sent\n"
                                 << cluster.log("scheduler");
  EXPECT_EQ(error->request_id, *id);
  EXPECT_EQ(n_killed, 3);  // the first send and two retries (--max-tokenizer-retries 2)
  EXPECT_NE(error->message.find("tokenizers died or went silent"), std::string::npos)
      << error->message;
}

// ---- 4: private run dir, sockets and step ring -------------------------------------------------

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(Fault, RunDirSocketsAndStepRingArePrivate) {
  ServiceCluster cluster;
  cluster.start_all();
  EXPECT_EQ(mode_of(cluster.run_dir()), 0750);
  for (const char* name : {"client", "worker", "tokenizer"}) {
    EXPECT_EQ(mode_of(cluster.run_dir() + "/" + name + ".sock"), 0660) << name;
  }
  std::smatch m;
  const std::string log = cluster.log("scheduler");
  ASSERT_TRUE(std::regex_search(log, m, std::regex("step ring (litellama-step-[0-9a-f-]+)")))
      << log;
  EXPECT_EQ(mode_of("/dev/shm/" + m[1].str()), 0600);
}

// Starts the scheduler on the cluster's prepared run dir and expects it to exit at once with the
// configuration error whose log line contains `reason`.
void expect_scheduler_refuses_run_dir(ServiceCluster& cluster, const std::string& reason) {
  cluster.start_scheduler();
  const auto code = wait_exit(cluster.process("scheduler"), 10000);
  ASSERT_TRUE(code.has_value()) << "the scheduler served on a run dir that " << reason;
  EXPECT_EQ(*code, net::kExitConfigError);
  EXPECT_NE(cluster.log("scheduler").find(reason), std::string::npos) << cluster.log("scheduler");
}

TEST(Fault, RunDirOthersCanWriteIsRefused) {
  ServiceCluster cluster;
  std::filesystem::create_directories(cluster.run_dir());
  std::filesystem::permissions(cluster.run_dir(), std::filesystem::perms(0777));
  expect_scheduler_refuses_run_dir(cluster, "is writable by its group or others");
}

TEST(Fault, RunDirOfAnotherUserIsRefused) {
  if (::geteuid() != 0) {
    GTEST_SKIP() << "needs root to create a directory owned by another user";
  }
  ServiceCluster cluster;
  std::filesystem::create_directories(cluster.run_dir());
  std::filesystem::permissions(cluster.run_dir(), std::filesystem::perms(0750));
  ASSERT_EQ(::chown(cluster.run_dir().c_str(), 65534, 65534), 0);
  expect_scheduler_refuses_run_dir(cluster, "belongs to uid 65534");
}

TEST(Fault, DefaultRunDirIsPerUser) {
  ServiceCluster cluster;
  const std::string xdg = (cluster.dir() / "xdg").string();
  for (const char* bin : {"litellama-scheduler", "litellama-worker", "litellama-tokenizer"}) {
    const CommandResult with_xdg =
        run_command("env XDG_RUNTIME_DIR=" + xdg + " " + cluster.bin_dir() + "/" + bin + " --help");
    EXPECT_NE(with_xdg.output.find(xdg + "/litellama"), std::string::npos)
        << bin << ": " << with_xdg.output;
    const CommandResult without =
        run_command("env -u XDG_RUNTIME_DIR " + cluster.bin_dir() + "/" + bin + " --help");
    EXPECT_NE(without.output.find("/tmp/litellama-" + std::to_string(::geteuid())),
              std::string::npos)
        << bin << ": " << without.output;
  }
  const CommandResult serve = run_command("env XDG_RUNTIME_DIR=" + xdg + " " + cluster.bin_dir() +
                                          "/litellama serve --help");
  EXPECT_NE(serve.output.find(xdg + "/litellama"), std::string::npos) << serve.output;
}

// ---- 5: tcp and metrics listeners --------------------------------------------------------------

// An IPv4 address of this machine other than loopback ("" when it has none).
std::string non_loopback_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if ((ntohl(in->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    found = text;
  }
  freeifaddrs(list);
  return found;
}

bool tcp_connects(const std::string& address, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, address.c_str(), &addr.sin_addr);
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return ok;
}

TEST(Fault, NonLoopbackTcpIsRefusedWithoutInsecureTcp) {
  ServiceCluster cluster;
  const std::string endpoint = "tcp://0.0.0.0:" + std::to_string(testing::free_tcp_port());
  cluster.start_process("open",
                        {cluster.bin_dir() + "/litellama-scheduler", "--run-dir", cluster.run_dir(),
                         "--client-endpoint", endpoint, "--metrics", ""});
  const auto code = wait_exit(cluster.process("open"), 10000);
  ASSERT_TRUE(code.has_value()) << "the scheduler listens on " << endpoint;
  EXPECT_EQ(*code, net::kExitConfigError);
  EXPECT_NE(cluster.log("open").find("--insecure-tcp"), std::string::npos) << cluster.log("open");

  cluster.start_process("insecure",
                        {cluster.bin_dir() + "/litellama-scheduler", "--run-dir", cluster.run_dir(),
                         "--client-endpoint", endpoint, "--metrics", "", "--insecure-tcp"});
  EXPECT_FALSE(wait_exit(cluster.process("insecure"), 1500).has_value()) << cluster.log("insecure");
}

TEST(Fault, BareMetricsPortListensOnLoopbackOnly) {
  const std::string other = non_loopback_address();
  if (other.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 address to probe";
  ServiceCluster cluster;
  const int port = testing::free_tcp_port();
  cluster.start_process("scheduler", {cluster.bin_dir() + "/litellama-scheduler", "--run-dir",
                                      cluster.run_dir(), "--metrics", std::to_string(port)});
  bool up = false;
  for (int i = 0; i < 200 && !up; ++i) {
    up = testing::http_get(port, "/health").first == 200;
    if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(up) << cluster.log("scheduler");
  EXPECT_FALSE(tcp_connects(other, port)) << "metrics reachable on " << other;
}

// ---- 6: clients with nothing to talk to --------------------------------------------------------

TEST(Fault, ClientsFailFastNamingTheAddressWhenNothingListens) {
  ServiceCluster cluster;
  std::filesystem::create_directories(cluster.run_dir());
  std::filesystem::permissions(cluster.run_dir(), std::filesystem::perms(0750));
  const std::string server = "ipc://" + cluster.run_dir() + "/client.sock";
  for (const std::string& args : {std::string("generate --input-ids 1,2,3 --server ") + server,
                                  std::string("chat -m hello --server ") + server,
                                  std::string("bench -n 1 --server ") + server}) {
    const CommandResult r = run_command(cluster.bin_dir() + "/litellama " + args, 40);
    EXPECT_NE(r.rc, 0) << args;
    EXPECT_LT(r.seconds, 6.0) << args << ": " << r.output;
    EXPECT_NE(r.output.find(server), std::string::npos) << args << ": " << r.output;
    EXPECT_NE(r.output.find("litellama serve"), std::string::npos) << args << ": " << r.output;
  }
}

// ---- 7: errors clients can act on --------------------------------------------------------------

TEST(Fault, MalformedRequestsGetTheirOwnIdAndSayWhatIsWrong) {
  ServiceCluster cluster;
  cluster.start_all();
  RawClient raw(cluster.endpoint("client"));

  raw.send(generate_request_with_string_max_tokens(proto::kProtocolVersion, 77));
  auto typed = raw.next_error(5000);
  ASSERT_TRUE(typed.has_value());
  EXPECT_EQ(typed->request_id, 77u);
  EXPECT_NE(typed->message.find("field 'max_tokens' has the wrong type"), std::string::npos)
      << typed->message;

  raw.send(generate_request_with_string_max_tokens(proto::kProtocolVersion + 1, 78));
  auto version = raw.next_error(5000);
  ASSERT_TRUE(version.has_value());
  EXPECT_EQ(version->request_id, 78u);
  EXPECT_NE(version->message.find(fmt::format("protocol version {}", proto::kProtocolVersion + 1)),
            std::string::npos)
      << version->message;

  proto::GenerateRequest two = ids_request(4);
  two.request_id = 79;
  raw.send_two_frames(proto::encode(two), proto::encode(two));
  auto frames = raw.next_error(5000);
  ASSERT_TRUE(frames.has_value()) << "a two-frame message got no request_error";
  EXPECT_EQ(frames->request_id, 79u);
  EXPECT_NE(frames->message.find("one ZeroMQ frame"), std::string::npos) << frames->message;
}

TEST(Fault, DuplicateRequestIdIsRefusedWithoutEndingTheLiveOne) {
  ServiceCluster cluster;
  cluster.start_all();
  RawClient raw(cluster.endpoint("client"));
  // A duplicate id is refused without ending the live request of that id.
  proto::GenerateRequest live = ids_request(200);
  live.request_id = 80;
  raw.send(proto::encode(live));
  raw.send(proto::encode(live));
  int n_final = 0;
  auto duplicate = raw.next_error(10000, &n_final, 80);
  ASSERT_TRUE(duplicate.has_value());
  EXPECT_EQ(duplicate->request_id, 0u) << "the duplicate's error reads as the live request's end";
  EXPECT_EQ(duplicate->duplicate_request_id, 80u);
  EXPECT_NE(duplicate->message.find("duplicate request_id 80"), std::string::npos);
  if (n_final == 0) {
    auto other = raw.next_error(30000, &n_final, 80, /*stop_at_final=*/true);
    EXPECT_FALSE(other.has_value()) << "request 80 ended in an error: " << other->message;
  }
  EXPECT_EQ(n_final, 1) << "the live request did not finish";
}

TEST(Fault, RequestOverTheContextSaysByHowMuchAndCountsNoPromptTokens) {
  ServiceCluster cluster;
  cluster.start_all();
  auto client = cluster.client();
  ASSERT_EQ(generate_error(*client, ids_request(4)), "");
  const double prompt_tokens_before =
      metric_value(cluster.scheduler_metrics(), "litellama_scheduler_prompt_tokens_total");
  EXPECT_EQ(prompt_tokens_before, 4);
  const int32_t context = model_context(cluster);
  const std::string error = generate_error(*client, ids_request(context));
  EXPECT_NE(error.find(fmt::format("exceeds the model's context of {} tokens by 4", context)),
            std::string::npos)
      << error;
  EXPECT_EQ(metric_value(cluster.scheduler_metrics(), "litellama_scheduler_prompt_tokens_total"),
            prompt_tokens_before);

  const CommandResult bench =
      run_command(cluster.bin_dir() + "/litellama bench -n 2 -c 1 --input-len 8 --output-len " +
                      std::to_string(context) + " --server " + cluster.endpoint("client"),
                  60);
  EXPECT_NE(bench.rc, 0);
  EXPECT_NE(bench.output.find("Failed requests: 2"), std::string::npos) << bench.output;
  EXPECT_NE(bench.output.find("exceeds the model's context"), std::string::npos) << bench.output;
}

TEST(Fault, OfflineGenerateEnforcesTheContext) {
  ServiceCluster cluster;
  cluster.make_model();
  const int32_t context = model_context(cluster);
  const CommandResult r =
      run_command(cluster.bin_dir() + "/litellama generate --model " + cluster.model_dir() +
                      " --input-ids 1,2,3 " + "--max-new-tokens " + std::to_string(context),
                  120);
  EXPECT_EQ(r.rc, 1) << r.output;
  EXPECT_NE(r.output.find(fmt::format("exceeds the model's context of {} tokens by 3", context)),
            std::string::npos)
      << r.output;
}

// Runs `command`, expects it to fail with `needle` in its output; what it did.
CommandResult expect_refused(const std::string& command, const std::string& needle,
                             int timeout_seconds = 30) {
  CommandResult r = run_command(command, timeout_seconds);
  EXPECT_NE(r.rc, 0) << command;
  EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  return r;
}

TEST(Fault, BadFlagsAreRefusedSayingWhatIsWrong) {
  ServiceCluster cluster;
  const std::string bin = cluster.bin_dir();
  const CommandResult typo = run_command(bin + "/litellama genrate --input-ids 1");
  EXPECT_EQ(typo.rc, 2);
  EXPECT_NE(typo.output.find("unknown command 'genrate'; did you mean 'generate'?"),
            std::string::npos)
      << typo.output;
  expect_refused(bin + "/litellama generate --top-k -1 --input-ids 1",
                 "must be 0 (off) or more, not -1");
  const CommandResult port =
      expect_refused(bin + "/litellama generate --server 127.0.0.1:99999 --input-ids 1",
                     "the port must be a number from 1 to 65535", 40);
  EXPECT_LT(port.seconds, 6.0);
  expect_refused(bin + "/litellama serve --metrics-port 70000", "'70000' is not a port");
  // Serving flags users type: a log level that does not exist, and a CPU KV budget below 1 MiB,
  // are refused before anything starts.
  expect_refused(bin + "/litellama serve --log-level loud",
                 "--log-level: loud not in {trace,debug,info,warn,error,off}");
  expect_refused(bin + "/litellama serve --kv-cache-bytes 10",
                 "--kv-cache-bytes: Value 10 not in range");
  const CommandResult timeout =
      run_command(bin + "/litellama-scheduler --run-dir " + cluster.run_dir() +
                  " --metrics '' --heartbeat-ms 200 --peer-timeout-ms 100");
  EXPECT_EQ(timeout.rc, net::kExitConfigError) << timeout.output;
  EXPECT_NE(timeout.output.find("--peer-timeout-ms 100 is below two heartbeat intervals"),
            std::string::npos)
      << timeout.output;
}

}  // namespace
}  // namespace litellama
