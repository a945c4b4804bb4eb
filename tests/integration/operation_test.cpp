// Operating the services: a taken metrics port is reported clearly and is not retried forever,
// `litellama serve` fails fast when a service cannot start, services do not outlive a launcher that
// was killed, and a restarted scheduler is found again by the worker and the tokenizer while the
// clients of the old one get errors instead of hanging.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/net/child_process.h"
#include "common/net/metrics_server.h"
#include "service_cluster.h"

namespace litellama {
namespace {

using testing::ServiceCluster;

// A listening TCP socket on 127.0.0.1 that holds a port for the test's lifetime.
class HeldPort {
 public:
  explicit HeldPort(int port = 0) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    ok_ = bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd_, 4) == 0;
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { close(fd_); }
  bool ok() const { return ok_; }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  bool ok_ = false;
};

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct Exit {
  int status = -1;  // -1: still running at the deadline (then killed)
  double seconds = 0.0;
  std::string output;
};

// Runs argv with stdout and stderr to `log` and waits up to timeout_ms for it to exit.
Exit run_to_exit(const std::vector<std::string>& argv, const std::filesystem::path& log,
                 int timeout_ms) {
  Exit exit;
  auto child = net::ChildProcess::spawn(argv, log.string());
  EXPECT_TRUE(child.is_ok());
  if (!child.is_ok()) return exit;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto code = child->poll()) {
      exit.status = *code;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  exit.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (exit.status < 0) child->stop(2000);
  exit.output = read_file(log);
  return exit;
}

// Pids of live processes whose command line mentions `needle`.
std::vector<int> processes_mentioning(const std::string& needle) {
  std::vector<int> pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = read_file(entry.path() / "cmdline");
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    const std::string stat = read_file(entry.path() / "stat");
    const size_t paren = stat.rfind(')');
    const bool zombie =
        paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] == 'Z';
    if (!zombie && cmdline.find(needle) != std::string::npos) pids.push_back(std::stoi(name));
  }
  return pids;
}

TEST(ServiceOperation, MetricsPortInUseIsAConfigErrorThatSaysSo) {
  ServiceCluster cluster;  // for its private directory and binaries
  HeldPort held;
  ASSERT_TRUE(held.ok());
  const std::string listen = "127.0.0.1:" + std::to_string(held.port());
  const std::string run = (cluster.dir() / "run").string();
  const std::vector<std::pair<std::string, std::vector<std::string>>> services = {
      {"worker",
       {cluster.bin_dir() + "/litellama-worker", "--model", (cluster.dir() / "no-model").string(),
        "--run-dir", run, "--metrics", listen}},
      {"scheduler",
       {cluster.bin_dir() + "/litellama-scheduler", "--run-dir", run, "--metrics", listen}},
  };
  for (const auto& [name, argv] : services) {
    const Exit exit = run_to_exit(argv, cluster.dir() / (name + ".log"), 10000);
    EXPECT_EQ(exit.status, net::kExitConfigError) << name << ":\n" << exit.output;
    EXPECT_NE(exit.output.find(listen + " is already in use"), std::string::npos) << name << ":\n"
                                                                                  << exit.output;
  }
}

TEST(ServiceOperation, ServeRefusesATakenMetricsPortBeforeStartingAnything) {
  ServiceCluster cluster;
  // The worker's port (base + 1) is the taken one, as in the failure this guards against; the
  // scheduler's (base) must be free for the report to be about the worker.
  std::unique_ptr<HeldPort> held;
  for (int attempt = 0; attempt < 50; ++attempt) {
    held = std::make_unique<HeldPort>();
    ASSERT_TRUE(held->ok());
    if (net::MetricsServer::check_available("127.0.0.1:" + std::to_string(held->port() - 1))) {
      break;
    }
  }
  const int base = held->port() - 1;
  const std::string run = (cluster.dir() / "run").string();
  const Exit exit =
      run_to_exit({cluster.bin_dir() + "/litellama", "serve", "--port", "0", "--model",
                   (cluster.dir() / "no-model").string(), "--run-dir", run, "--metrics-port",
                   std::to_string(base), "--ready-timeout-ms", "60000"},
                  cluster.dir() / "serve.log", 10000);
  EXPECT_EQ(exit.status, 1) << exit.output;
  EXPECT_LT(exit.seconds, 5.0);
  const std::string port = "127.0.0.1:" + std::to_string(held->port());
  EXPECT_NE(exit.output.find("metrics port of the worker: " + port + " is already in use"),
            std::string::npos)
      << exit.output;
  EXPECT_NE(exit.output.find("--metrics-port 0"), std::string::npos) << exit.output;
  EXPECT_TRUE(processes_mentioning(run).empty());
}

TEST(ServiceOperation, ServeFailsFastWhenAServiceExitsWhileStarting) {
  ServiceCluster cluster;
  const std::string run = (cluster.dir() / "run").string();
  const std::string logs = (cluster.dir() / "logs").string();
  // No model there: the worker and the tokenizer exit at once. Before, serve waited out the
  // whole ready timeout (300 s by default) without a word.
  const Exit exit =
      run_to_exit({cluster.bin_dir() + "/litellama", "serve", "--port", "0", "--model",
                   (cluster.dir() / "no-model").string(), "--run-dir", run, "--metrics-port", "0",
                   "--log-dir", logs, "--ready-timeout-ms", "60000"},
                  cluster.dir() / "serve.log", 20000);
  EXPECT_EQ(exit.status, 1) << exit.output;
  EXPECT_LT(exit.seconds, 10.0);
  EXPECT_NE(exit.output.find("while the services were starting"), std::string::npos) << exit.output;
  // The reason from the service's own log is part of the message.
  EXPECT_NE(exit.output.find("no-model"), std::string::npos) << exit.output;
  EXPECT_TRUE(processes_mentioning(run).empty());
}

TEST(ServiceOperation, ServicesDoNotOutliveAKilledServe) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  const std::string run = (cluster.dir() / "serve-run").string();
  auto serve = net::ChildProcess::spawn(
      {cluster.bin_dir() + "/litellama", "serve", "--port", "0", "--model", cluster.model_dir(),
       "--run-dir", run, "--metrics-port", "0", "--kv-slots", "1024", "--threads", "1", "--log-dir",
       (cluster.dir() / "logs").string()},
      (cluster.dir() / "serve.log").string());
  ASSERT_TRUE(serve.is_ok());
  auto client = net::SchedulerClient::connect(net::ipc_endpoint(run, "client"));
  ASSERT_TRUE(client.is_ok());
  ASSERT_TRUE((*client)->wait_ready(30000).is_ok()) << read_file(cluster.dir() / "serve.log");
  ASSERT_EQ(processes_mentioning(run).size(), 4u);  // serve and its three services

  // SIGKILL leaves no chance to stop the children: they must go on their own, or they would
  // keep the sockets, the step ring and the metrics ports of the next serve.
  serve->signal(SIGKILL);
  serve->poll();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!processes_mentioning(run).empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(processes_mentioning(run).empty());
}

TEST(ServiceOperation, SchedulerRestartFailsOpenRequestsAndPeersReconnect) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_all());
  auto c = cluster.client();
  // Each request needs most of the KV pool, so one runs and the others wait: all still open
  // when the scheduler goes.
  const std::vector<uint64_t> ids =
      testing::submit_ignoring_eos(*c, 3, ServiceCluster::kKvSlots - 100);
  bool streaming = false;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!streaming && std::chrono::steady_clock::now() < deadline) {
    auto e = c->next_event(100);
    ASSERT_TRUE(e.is_ok());
    if (*e) {
      ASSERT_EQ((*e)->kind, net::ClientEvent::Kind::kChunk);
      streaming = true;
    }
  }
  ASSERT_TRUE(streaming);

  cluster.process("scheduler").signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  // Every open request ends with an error, soon: the new scheduler will not know them.
  std::set<uint64_t> failed;
  deadline = killed_at + std::chrono::seconds(5);
  while (failed.size() < ids.size() && std::chrono::steady_clock::now() < deadline) {
    auto e = c->next_event(100);
    ASSERT_TRUE(e.is_ok());
    if (*e && (*e)->kind == net::ClientEvent::Kind::kError) {
      failed.insert((*e)->request_id());
      EXPECT_EQ((*e)->error.code, "unavailable");
    }
  }
  EXPECT_EQ(failed.size(), ids.size());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count(),
            3.0);

  // The worker's gauge of the scheduler, which follows at its next heartbeat tick.
  auto expect_worker_sees_scheduler = [&](bool up) {
    auto gauge = [&] {
      return testing::metric_value(cluster.worker_metrics(), "litellama_worker_scheduler_up");
    };
    testing::poll_until([&] { return gauge() == (up ? 1 : 0); }, 2000);
    EXPECT_EQ(gauge(), up ? 1 : 0);
  };
  // The worker and the tokenizer see the scheduler gone (/ready 503, still live).
  for (int port : {cluster.worker_port(), cluster.tokenizer_port()}) {
    testing::poll_until([&] { return testing::http_get(port, "/ready").first == 503; }, 5000);
    EXPECT_EQ(testing::http_get(port, "/ready").first, 503) << port;
    EXPECT_EQ(testing::http_get(port, "/health").first, 200) << port;
  }
  expect_worker_sees_scheduler(false);

  // A new scheduler: both peers come back to it by themselves and it serves.
  cluster.start_scheduler();
  cluster.wait_ready();
  const proto::GenerateRequest r = testing::ignoring_eos_request({100, 200, 300}, 8);
  auto done = c->generate(r, nullptr, 30000);
  ASSERT_TRUE(done.is_ok()) << done.status().to_string() << "\n" << cluster.logs();
  EXPECT_EQ(done->token_ids.size(), 8u);
  for (int port : {cluster.scheduler_port(), cluster.worker_port(), cluster.tokenizer_port()}) {
    EXPECT_EQ(testing::http_get(port, "/ready").first, 200) << port;
  }
  expect_worker_sees_scheduler(true);
  EXPECT_TRUE(cluster.wait_metric("litellama_scheduler_kv_slots_used", 0));
}

}  // namespace
}  // namespace litellama
