#include "tools/haproxy_runtime.h"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace qparams {
namespace {

// Closes the socket when it goes.
class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

void SetTimeouts(int fd, absl::Duration timeout) {
  const timeval tv = absl::ToTimeval(timeout);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

absl::Status Errno(absl::string_view what, absl::string_view admin) {
  const int error = errno;
  const absl::StatusCode code = error == EAGAIN || error == EWOULDBLOCK
                                    ? absl::StatusCode::kDeadlineExceeded
                                    : absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat("HAProxy runtime API ", admin, ": cannot ", what, ": ",
                                         std::strerror(error)));
}

// HAProxy's answer to a command that answers nothing on success: OK, or its text.
absl::Status Silent(absl::string_view command, absl::string_view answer) {
  if (absl::StripAsciiWhitespace(answer).empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("HAProxy refused \"", command,
                                                    "\": ", absl::StripAsciiWhitespace(answer)));
}

}  // namespace

absl::StatusOr<HaproxyRuntime> HaproxyRuntime::Create(const std::string& admin,
                                                      absl::Duration timeout) {
  if (admin.empty()) return absl::InvalidArgumentError("the HAProxy admin socket is empty");
  if (timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the HAProxy runtime API timeout must be positive");
  }
  absl::string_view path = admin;
  if (absl::ConsumePrefix(&path, "unix:") || absl::StartsWith(path, "/") ||
      absl::StartsWith(path, ".")) {
    if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the HAProxy admin socket path ", path, " is too long"));
    }
    return HaproxyRuntime(std::string(path), /*unix_socket=*/true, timeout);
  }
  const size_t colon = admin.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(admin).substr(colon + 1), &port) || port <= 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the HAProxy admin socket \"", admin,
        "\" is neither a UNIX socket path (/PATH, unix:PATH) nor HOST:PORT"));
  }
  return HaproxyRuntime(admin, /*unix_socket=*/false, timeout);
}

absl::StatusOr<std::string> HaproxyRuntime::Command(absl::string_view command) const {
  if (unix_socket_) {
    Socket owned(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (owned.fd() < 0) return Errno("create a socket", admin_);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, admin_.data(), admin_.size());
    SetTimeouts(owned.fd(), timeout_);
    if (connect(owned.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
      return Errno("connect", admin_);
    }
    return Exchange(owned.fd(), command);
  }
  const size_t colon = admin_.rfind(':');
  std::string host = admin_.substr(0, colon);
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int error = getaddrinfo(host.c_str(), admin_.c_str() + colon + 1, &hints, &found);
      error != 0) {
    return absl::UnavailableError(absl::StrCat("HAProxy runtime API ", admin_, ": cannot resolve ",
                                               host, ": ", gai_strerror(error)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("HAProxy runtime API ", admin_,
                                                          ": no address"));
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    Socket owned(socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (owned.fd() < 0) {
      last = Errno("create a socket", admin_);
      continue;
    }
    SetTimeouts(owned.fd(), timeout_);
    if (connect(owned.fd(), a->ai_addr, a->ai_addrlen) != 0) {
      last = Errno("connect", admin_);
      continue;
    }
    freeaddrinfo(found);
    return Exchange(owned.fd(), command);
  }
  freeaddrinfo(found);
  return last;
}

absl::StatusOr<std::string> HaproxyRuntime::Exchange(int fd, absl::string_view command) const {
  const std::string line = absl::StrCat(command, "\n");
  for (size_t sent = 0; sent < line.size();) {
    const ssize_t n = send(fd, line.data() + sent, line.size() - sent, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("send", admin_);
    }
    sent += static_cast<size_t>(n);
  }
  // Not interactive: HAProxy answers the one command and closes.
  std::string answer;
  char buffer[4096];
  while (true) {
    const ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Errno("read the answer", admin_);
    }
    if (n == 0) break;
    answer.append(buffer, static_cast<size_t>(n));
  }
  return answer;
}

absl::StatusOr<std::vector<std::string>> HaproxyRuntime::ListMaps() const {
  absl::StatusOr<std::string> answer = Command("show map");
  if (!answer.ok()) return answer.status();
  // "# id (file) description" then "-1 (/etc/qparams/slots.map) pattern loaded ...".
  std::vector<std::string> maps;
  for (absl::string_view line : absl::StrSplit(*answer, '\n', absl::SkipEmpty())) {
    if (absl::StartsWith(line, "#")) continue;
    const size_t open = line.find('(');
    const size_t close = line.find(')', open);
    if (open == absl::string_view::npos || close == absl::string_view::npos) {
      return absl::FailedPreconditionError(
          absl::StrCat("HAProxy's \"show map\" line \"", line, "\" names no file"));
    }
    maps.emplace_back(line.substr(open + 1, close - open - 1));
  }
  return maps;
}

absl::StatusOr<std::vector<HaproxyRuntime::MapEntry>> HaproxyRuntime::ShowMap(
    const std::string& map) const {
  const std::string command = absl::StrCat("show map ", map);
  absl::StatusOr<std::string> answer = Command(command);
  if (!answer.ok()) return answer.status();
  // "0x5581b0c0e6f0 0:84 r0" per entry.
  std::vector<MapEntry> entries;
  for (absl::string_view line : absl::StrSplit(*answer, '\n', absl::SkipEmpty())) {
    const std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.size() != 3 || !absl::StartsWith(fields[0], "0x")) {
      return absl::FailedPreconditionError(
          absl::StrCat("HAProxy refused \"", command, "\": ", absl::StripAsciiWhitespace(*answer)));
    }
    entries.push_back({std::string(fields[1]), std::string(fields[2])});
  }
  return entries;
}

absl::Status HaproxyRuntime::ReplaceMap(const std::string& map, const SlotMap& slot_map) const {
  const std::string prepare = absl::StrCat("prepare map ", map);
  absl::StatusOr<std::string> prepared = Command(prepare);
  if (!prepared.ok()) return prepared.status();
  // "New version created: 3".
  absl::string_view version = absl::StripAsciiWhitespace(*prepared);
  if (!absl::ConsumePrefix(&version, "New version created:")) {
    return absl::FailedPreconditionError(absl::StrCat("HAProxy refused \"", prepare, "\": ",
                                                      absl::StripAsciiWhitespace(*prepared)));
  }
  version = absl::StripAsciiWhitespace(version);
  std::vector<SlotMap::Range> ranges = slot_map.Ranges();
  for (const SlotMap::Range& range : ranges) {
    const std::string add = absl::StrCat("add map @", version, " ", map, " ", range.low, ":",
                                         range.high, " ", range.replica);
    absl::StatusOr<std::string> answer = Command(add);
    if (!answer.ok()) return answer.status();
    if (absl::Status refused = Silent(add, *answer); !refused.ok()) return refused;
  }
  const std::string commit = absl::StrCat("commit map @", version, " ", map);
  absl::StatusOr<std::string> committed = Command(commit);
  if (!committed.ok()) return committed.status();
  if (absl::Status refused = Silent(commit, *committed); !refused.ok()) return refused;

  absl::StatusOr<std::vector<MapEntry>> entries = ShowMap(map);
  if (!entries.ok()) return entries.status();
  bool same = entries->size() == ranges.size();
  for (size_t i = 0; same && i < ranges.size(); ++i) {
    same = (*entries)[i].key == absl::StrCat(ranges[i].low, ":", ranges[i].high) &&
           (*entries)[i].value == ranges[i].replica;
  }
  if (!same) {
    return absl::InternalError(absl::StrCat("HAProxy's map ", map, " after the commit of version ",
                                            version, " holds ", entries->size(),
                                            " entries that are not the ", ranges.size(),
                                            " ranges sent"));
  }
  return absl::OkStatus();
}

absl::Status HaproxyRuntime::SetServer(const std::string& backend, const std::string& server,
                                       const std::string& host, int port, int check_port) const {
  const std::string name = absl::StrCat(backend, "/", server);
  for (const std::string& target : {absl::StrCat(kPoolBackend, "/", server), name}) {
    const std::string addr = absl::StrCat("set server ", target, " addr ", host, " port ", port);
    absl::StatusOr<std::string> answer = Command(addr);
    if (!answer.ok()) return answer.status();
    // "IP changed from ... to ..., port changed from ... to ... by 'stats socket
    // command'" or "no need to change the addr"; anything else is a refusal.
    if (!absl::StrContains(*answer, "changed") && !absl::StrContains(*answer, "no need")) {
      return absl::FailedPreconditionError(absl::StrCat("HAProxy refused \"", addr, "\": ",
                                                        absl::StripAsciiWhitespace(*answer)));
    }
  }
  absl::StatusOr<std::string> answer;
  if (check_port > 0) {
    const std::string check = absl::StrCat("set server ", name, " check-port ", check_port);
    answer = Command(check);
    if (!answer.ok()) return answer.status();
    // HAProxy 2.6 answers nothing on success (older versions "... updated").
    if (!absl::StripAsciiWhitespace(*answer).empty() && !absl::StrContains(*answer, "updated")) {
      return absl::FailedPreconditionError(
          absl::StrCat("HAProxy refused \"", check, "\": ", absl::StripAsciiWhitespace(*answer)));
    }
  }
  const std::string ready = absl::StrCat("set server ", name, " state ready");
  answer = Command(ready);
  if (!answer.ok()) return answer.status();
  return Silent(ready, *answer);
}

absl::Status HaproxyRuntime::DisableServer(const std::string& backend,
                                           const std::string& server) const {
  const std::string maint = absl::StrCat("set server ", backend, "/", server, " state maint");
  absl::StatusOr<std::string> answer = Command(maint);
  if (!answer.ok()) return answer.status();
  return Silent(maint, *answer);
}

}  // namespace qparams
