// "HOST:PORT" listening addresses, as the flags --listen and --metrics_listen give
// them: the one parser the gRPC server and the metrics endpoint share.

#ifndef QPARAMS_COMMON_HOST_PORT_H_
#define QPARAMS_COMMON_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace qparams {

struct HostPort {
  std::string host;  // without the brackets of an IPv6 address
  int port = 0;      // 0 to 65535; 0 asks for a free port
};

// "HOST:PORT" (or "[IPV6]:PORT") split at its last colon. INVALID_ARGUMENT, quoting
// `text`, for an empty host, unbalanced brackets or a port that is not 0 to 65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view text);

// "host:port", the host in brackets if it holds a colon (IPv6).
std::string FormatHostPort(absl::string_view host, int port);

}  // namespace qparams

#endif  // QPARAMS_COMMON_HOST_PORT_H_
