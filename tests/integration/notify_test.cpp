// The services' service-manager notifications (the sd_notify protocol of systemd's Type=notify
// units), received on a datagram socket of the test as systemd would receive them: each service
// sends READY=1 once it is up by itself, also while its peers are down (so no start order can
// deadlock); the worker extends its start timeout while it loads; SIGTERM brings STOPPING=1.
#include <sys/socket.h>
#include <sys/un.h>

#include <csignal>
#include <optional>

#include "tests/integration/service_cluster.h"

namespace litellama {
namespace {

using testing::ServiceCluster;

class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path.c_str());
    ok_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    const int on = 1;
    ok_ = ok_ && setsockopt(fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  bool ok() const { return ok_; }

  // Waits for a datagram from `pid` containing `needle`; returns every datagram of that pid
  // received meanwhile, joined ("" when it did not come within timeout_ms).
  std::string wait_for(pid_t pid, const std::string& needle, int timeout_ms) {
    std::string seen;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (std::chrono::steady_clock::now() < deadline) {
      timeval tv{0, 100000};
      setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      char buf[4096];
      char control[CMSG_SPACE(sizeof(ucred))];
      iovec iov{buf, sizeof(buf) - 1};
      msghdr msg{};
      msg.msg_iov = &iov;
      msg.msg_iovlen = 1;
      msg.msg_control = control;
      msg.msg_controllen = sizeof(control);
      const ssize_t n = recvmsg(fd_, &msg, 0);
      if (n <= 0) continue;
      pid_t sender = -1;
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_CREDENTIALS) {
          ucred cred;
          std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
          sender = cred.pid;
        }
      }
      if (sender != pid) continue;
      const std::string text(buf, static_cast<size_t>(n));
      seen += text + "\n";
      if (text.find(needle) != std::string::npos) return seen;
    }
    return "";
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool ok_ = false;
};

TEST(ServiceNotify, EachServiceIsReadyByItselfAndReportsStopping) {
  ServiceCluster cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.make_model());
  const std::string path = (cluster.dir() / "notify.sock").string();
  NotifySocket notify(path);
  ASSERT_TRUE(notify.ok()) << std::strerror(errno);
  // The children inherit it, as from systemd.
  ASSERT_EQ(setenv("NOTIFY_SOCKET", path.c_str(), 1), 0);

  // The worker first, with no scheduler anywhere: it loads, says so, and is ready by itself,
  // while its /ready (end to end) is 503 because the scheduler is down.
  cluster.start_worker();
  const std::string worker = notify.wait_for(cluster.process("worker").pid(), "READY=1", 30000);
  ASSERT_FALSE(worker.empty()) << "no READY=1 from the worker\n" << cluster.logs();
  EXPECT_NE(worker.find("EXTEND_TIMEOUT_USEC="), std::string::npos) << worker;
  EXPECT_NE(worker.find("STATUS=weights: "), std::string::npos) << worker;
  EXPECT_LT(worker.find("EXTEND_TIMEOUT_USEC="), worker.find("READY=1")) << worker;
  EXPECT_EQ(testing::http_get(cluster.worker_port(), "/ready").first, 503);

  cluster.start_tokenizer();
  EXPECT_FALSE(notify.wait_for(cluster.process("tokenizer").pid(), "READY=1", 30000).empty())
      << "no READY=1 from the tokenizer\n"
      << cluster.logs();

  cluster.start_scheduler();
  EXPECT_FALSE(notify.wait_for(cluster.process("scheduler").pid(), "READY=1", 30000).empty())
      << "no READY=1 from the scheduler\n"
      << cluster.logs();
  unsetenv("NOTIFY_SOCKET");
  ASSERT_NO_FATAL_FAILURE(cluster.wait_ready());

  for (const char* name : {"scheduler", "worker", "tokenizer"}) {
    net::ChildProcess& p = cluster.process(name);
    p.signal(SIGTERM);
    EXPECT_FALSE(notify.wait_for(p.pid(), "STOPPING=1", 10000).empty())
        << "no STOPPING=1 from the " << name << "\n"
        << cluster.logs();
    // It drains and exits by itself (a second SIGTERM would end it at once).
    std::optional<int> code;
    for (int i = 0; i < 200 && !(code = p.poll()); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(code.has_value()) << name << " did not exit after SIGTERM";
    EXPECT_EQ(*code, 0) << name;
  }
}

}  // namespace
}  // namespace litellama
