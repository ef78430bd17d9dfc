#include "metrics/metrics_http.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace qparams {

absl::Status ParseHostPort(absl::string_view text, std::string* host, int* port) {
  const size_t colon = text.rfind(':');
  absl::string_view name = colon == absl::string_view::npos ? "" : text.substr(0, colon);
  if (absl::ConsumePrefix(&name, "[") && !absl::ConsumeSuffix(&name, "]")) name = "";
  if (name.empty() || !absl::SimpleAtoi(text.substr(colon + 1), port) || *port < 0 ||
      *port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\" is not HOST:PORT with a port of 0 to 65535 (e.g. 0.0.0.0:9100)"));
  }
  *host = std::string(name);
  return absl::OkStatus();
}

MetricsHttpServer::MetricsHttpServer() : http_(std::make_unique<httplib::Server>()) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    absl::string_view listen, const MetricsRegistry* registry) {
  std::string host;
  int port = 0;
  if (absl::Status s = ParseHostPort(listen, &host, &port); !s.ok()) return s;
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  httplib::Server& http = *server->http_;
  // Scrapes are rare and cheap: two threads, not httplib's default of one per core.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry->Render(), MetricsRegistry::kContentType);
  });
  server->port_ =
      port == 0 ? http.bind_to_any_port(host) : (http.bind_to_port(host, port) ? port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen, " (in use, or not a local address)"));
  }
  server->address_ = absl::StrCat(listen.substr(0, listen.rfind(':')), ":", server->port_);
  MetricsHttpServer* self = server.get();
  server->thread_ = std::thread([self] {
    self->http_->listen_after_bind();
    self->ended_ = true;
  });
  // httplib's stop() does nothing until the thread has marked the server running:
  // wait for that here, so that Stop can never miss it (it takes microseconds).
  while (!http.is_running() && !server->ended_) absl::SleepFor(absl::Microseconds(50));
  return server;
}

void MetricsHttpServer::Stop() {
  if (!thread_.joinable()) return;
  http_->stop();
  thread_.join();
}

}  // namespace qparams
