#include "server/server.h"

#include <chrono>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"

namespace qparams {

QParamsServer::QParamsServer(const ServerOptions& options)
    : engine_(options.engine), service_(&engine_, options.service) {}

QParamsServer::~QParamsServer() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<QParamsServer>> QParamsServer::Start(
    const ServerOptions& options) {
  const size_t colon = options.listen.rfind(':');
  int requested_port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.listen.substr(colon + 1), &requested_port) ||
      requested_port < 0 || requested_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "listen address \"", options.listen, "\" is not host:port (e.g. 127.0.0.1:50051)"));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes is ", options.max_message_bytes, "; it must be > 0"));
  }

  // Process-wide switches; both must be set before a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<QParamsServer> server(new QParamsServer(options));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(&server->service_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    if (server->server_ != nullptr) server->Shutdown(absl::ZeroDuration());
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (in use, or not a local address)"));
  }
  server->address_ = absl::StrCat(options.listen.substr(0, colon), ":", server->port_);
  server->server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  return server;
}

void QParamsServer::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // Health first, so probes see NOT_SERVING from the moment shutdown begins.
  server_->GetHealthCheckService()->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void QParamsServer::Wait() { server_->Wait(); }

}  // namespace qparams
