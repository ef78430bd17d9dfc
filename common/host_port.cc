#include "common/host_port.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace qparams {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view text) {
  const size_t colon = text.rfind(':');
  absl::string_view name = colon == absl::string_view::npos ? "" : text.substr(0, colon);
  if (absl::ConsumePrefix(&name, "[") && !absl::ConsumeSuffix(&name, "]")) name = "";
  HostPort parsed;
  if (name.empty() || !absl::SimpleAtoi(text.substr(colon + 1), &parsed.port) ||
      parsed.port < 0 || parsed.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not HOST:PORT with a port of 0 to 65535 (e.g. 127.0.0.1:50051)"));
  }
  parsed.host = std::string(name);
  return parsed;
}

std::string FormatHostPort(absl::string_view host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

}  // namespace qparams
