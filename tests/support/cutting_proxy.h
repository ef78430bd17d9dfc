// A TCP proxy on loopback that can lose a server's answers: the tests' injected
// lost response (tests/client/retry_test.cc). Until DropAnswers() it forwards bytes both
// ways; after it, what the server sends is dropped, so a call the server applied
// gets no answer; Cut() then closes every connection (the client sees UNAVAILABLE)
// and later connections are forwarded again.

#ifndef QPARAMS_TESTS_CUTTING_PROXY_H_
#define QPARAMS_TESTS_CUTTING_PROXY_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace qparams::testing {

class CuttingProxy {
 public:
  // A proxy on 127.0.0.1 and a port the OS picks, to `backend` ("127.0.0.1:PORT");
  // null if it cannot listen.
  static std::unique_ptr<CuttingProxy> Start(const std::string& backend) {
    int port = 0;
    const size_t colon = backend.rfind(':');
    if (colon == std::string::npos || !absl::SimpleAtoi(backend.substr(colon + 1), &port)) {
      return nullptr;
    }
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(fd, 16) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      if (fd >= 0) close(fd);
      return nullptr;
    }
    return std::unique_ptr<CuttingProxy>(new CuttingProxy(fd, ntohs(addr.sin_port), port));
  }

  ~CuttingProxy() {
    shutdown(listen_fd_, SHUT_RDWR);  // wakes accept()
    acceptor_.join();
    Cut();
    std::vector<std::thread> pumps;
    {
      absl::MutexLock lock(&mu_);
      pumps.swap(pumps_);
    }
    for (std::thread& t : pumps) t.join();
    close(listen_fd_);
  }

  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }

  // From now until Cut(), the server's bytes never reach the client.
  void DropAnswers() { dropping_ = true; }

  // Closes every open connection (dropping what the server sent) and forwards the
  // next connections again.
  void Cut() {
    absl::MutexLock lock(&mu_);
    for (int fd : open_fds_) shutdown(fd, SHUT_RDWR);  // wakes the pumps' poll()
    open_fds_.clear();
    dropping_ = false;
  }

 private:
  CuttingProxy(int listen_fd, int port, int backend_port)
      : listen_fd_(listen_fd), port_(port), backend_port_(backend_port) {
    acceptor_ = std::thread([this] { Accept(); });
  }

  void Accept() {
    while (true) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;  // shut down
      const int server = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      addr.sin_port = htons(backend_port_);
      if (server < 0 || connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        if (server >= 0) close(server);
        close(client);
        continue;
      }
      absl::MutexLock lock(&mu_);
      open_fds_.push_back(client);
      open_fds_.push_back(server);
      pumps_.emplace_back([this, client, server] { Pump(client, server); });
    }
  }

  // Forwards both ways until either side closes or Cut() shuts them down.
  void Pump(int client, int server) {
    pollfd fds[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
    char buffer[16384];
    bool open = true;
    while (open && poll(fds, 2, -1) > 0) {
      for (int i = 0; i < 2 && open; ++i) {
        if (fds[i].revents == 0) continue;
        const ssize_t n = read(fds[i].fd, buffer, sizeof(buffer));
        if (n <= 0) {
          open = false;
          break;
        }
        if (i == 1 && dropping_) continue;
        const int to = i == 0 ? server : client;
        for (ssize_t sent = 0; sent < n && open;) {
          // MSG_NOSIGNAL: a side Cut() shut down (or that hung up) is an error to
          // end the pump on, not a SIGPIPE that kills the test process.
          const ssize_t w = send(to, buffer + sent, n - sent, MSG_NOSIGNAL);
          if (w <= 0) open = false;
          sent += w;
        }
      }
    }
    {
      // Out of Cut's reach before the numbers can be reused.
      absl::MutexLock lock(&mu_);
      open_fds_.erase(std::remove_if(open_fds_.begin(), open_fds_.end(),
                                     [&](int fd) { return fd == client || fd == server; }),
                      open_fds_.end());
    }
    close(client);
    close(server);
  }

  const int listen_fd_;
  const int port_;
  const int backend_port_;
  std::atomic<bool> dropping_{false};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> open_fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

}  // namespace qparams::testing

#endif  // QPARAMS_TESTS_CUTTING_PROXY_H_
