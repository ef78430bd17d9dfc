#include "metrics/metrics_http.h"

#include <httplib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace qparams {

MetricsHttpServer::MetricsHttpServer() : http_(std::make_unique<httplib::Server>()) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

namespace {

// 200 "SERVING" or 503 "NOT_SERVING: why", as plain text no cache keeps.
httplib::Server::Handler HealthHandler(std::function<absl::Status()> check) {
  return [check = std::move(check)](const httplib::Request&, httplib::Response& response) {
    const absl::Status status = check();
    response.status = status.ok() ? 200 : 503;
    response.set_header("Cache-Control", "no-store");
    response.set_content(
        status.ok() ? std::string("SERVING\n") : absl::StrCat("NOT_SERVING: ", status.message(), "\n"),
        "text/plain; charset=utf-8");
  };
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const HostPort& listen, const MetricsRegistry* registry, HttpHealthChecks health) {
  if (!health.ready || !health.live) {
    return absl::InvalidArgumentError("the health endpoint needs both checks, ready and live");
  }
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  httplib::Server& http = *server->http_;
  // Scrapes and health checks are rare and cheap: two threads, not httplib's default
  // of one per core.
  http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  http.Get("/metrics", [registry](const httplib::Request&, httplib::Response& response) {
    response.set_content(registry->Render(), MetricsRegistry::kContentType);
  });
  http.Get("/healthz", HealthHandler(std::move(health.ready)));
  http.Get("/livez", HealthHandler(std::move(health.live)));
  server->port_ = listen.port == 0
                      ? http.bind_to_any_port(listen.host)
                      : (http.bind_to_port(listen.host, listen.port) ? listen.port : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ",
                                               FormatHostPort(listen.host, listen.port),
                                               " (in use, or not a local address)"));
  }
  server->address_ = FormatHostPort(listen.host, server->port_);
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
