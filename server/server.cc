#include "server/server.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/host_port.h"
#include "common/log.h"
#include "core/range.h"
#include "core/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "server/call_metrics.h"

namespace qparams {
namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, absl::string_view flag) {
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return absl::FailedPreconditionError(absl::StrCat(flag, ": ", text.status().message()));
  return text;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together");
  }
  if (options.tls_cert.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  grpc::SslServerCredentialsOptions ssl(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  QPARAMS_ASSIGN_OR_RETURN(const std::string cert, ReadPem(options.tls_cert, "--tls_cert"));
  QPARAMS_ASSIGN_OR_RETURN(const std::string key, ReadPem(options.tls_key, "--tls_key"));
  ssl.pem_key_cert_pairs.push_back({key, cert});
  if (!options.tls_client_ca.empty()) {
    QPARAMS_ASSIGN_OR_RETURN(const std::string ca,
                             ReadPem(options.tls_client_ca, "--tls_client_ca"));
    ssl.pem_root_certs = ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

int Milliseconds(absl::Duration d) {
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
}

absl::Status CheckLimits(const ServerOptions& options) {
  if (options.max_concurrent_streams < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_concurrent_streams is ", options.max_concurrent_streams, "; it must be >= 1"));
  }
  if (options.max_connection_idle < absl::ZeroDuration() ||
      options.handshake_timeout <= absl::ZeroDuration() ||
      options.keepalive_time <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "max_connection_idle must be >= 0, handshake_timeout and keepalive_time > 0");
  }
  return absl::OkStatus();
}

// A server others can reach must encrypt and know its callers, unless told not to.
absl::Status CheckExposure(const ServerOptions& options, absl::string_view host) {
  if (options.allow_insecure || IsLoopbackHost(host)) return absl::OkStatus();
  const bool tls = !options.tls_cert.empty();
  const bool authenticates = !options.auth_tokens_file.empty() || !options.tls_client_ca.empty();
  if (tls && authenticates) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to serve ", options.listen, ", reachable from other machines, ",
      !tls ? "in plaintext" : "", !tls && !authenticates ? " and " : "",
      !authenticates ? "to anyone (no --auth_tokens_file, no --tls_client_ca)" : "",
      ": give --tls_cert/--tls_key and --auth_tokens_file (docs/security.md), listen on "
      "127.0.0.1, or pass --allow_insecure to accept the risk"));
}

void ApplyConnectionLimits(const ServerOptions& options, grpc::ServerBuilder* builder) {
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  if (options.max_connection_idle > absl::ZeroDuration()) {
    builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                                Milliseconds(options.max_connection_idle));
  }
  builder->AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                              Milliseconds(options.handshake_timeout));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, Milliseconds(options.keepalive_time));
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  // A client that turns gRPC's keepalive on (ours do not) may ping every 10 s, calls
  // in flight or not, before the server calls it abusive and closes the connection.
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder->AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

}  // namespace

bool IsLoopbackHost(absl::string_view host) {
  if (absl::EqualsIgnoreCase(host, "localhost") || host == "::1") return true;
  return absl::StartsWith(host, "127.");
}

void ApplyTransportSettings(int max_message_bytes, grpc::ServerBuilder* builder) {
  constexpr int kMaxFrameBytes = (1 << 24) - 1;  // the largest HTTP/2 allows
  constexpr int kStreamWindowBytes = 8 << 20;
  builder->SetMaxReceiveMessageSize(max_message_bytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  builder->AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kStreamWindowBytes);
}

QParamsServer::~QParamsServer() { Shutdown(absl::ZeroDuration()); }

absl::StatusOr<std::unique_ptr<QParamsServer>> QParamsServer::Start(
    const ServerOptions& options) {
  absl::StatusOr<HostPort> listen = ParseHostPort(options.listen);
  if (!listen.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address: ", listen.status().message()));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes is ", options.max_message_bytes, "; it must be > 0"));
  }
  if (options.omp_threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("omp_threads is ", options.omp_threads, "; it must be >= 0"));
  }
  if (options.durability != Durability::kNone && options.data_dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--durability=", DurabilityName(options.durability), " needs --data_dir"));
  }
  QPARAMS_RETURN_IF_ERROR(CheckLimits(options));
  QPARAMS_RETURN_IF_ERROR(CheckExposure(options, listen->host));
  QPARAMS_ASSIGN_OR_RETURN(const std::shared_ptr<grpc::ServerCredentials> credentials,
                           Credentials(options));

  SetRangeThreads(options.omp_threads);
  std::unique_ptr<QParamsServer> server(new QParamsServer());
  ServiceOptions service_options = options.service;
  service_options.received_bytes = server->server_metrics_.received_bytes();
  QPARAMS_ASSIGN_OR_RETURN(
      server->authorizer_,
      Authorizer::Load(options.auth_tokens_file, options.admin_tokens_file,
                       server->server_metrics_.auth_refusals()));
  service_options.authorizer = server->authorizer_.get();

  EngineOptions engine_options = options.engine;
  engine_options.observations = server->server_metrics_.observations();
  engine_options.step_contributions = server->server_metrics_.step_contributions();
  engine_options.steps_closed_incomplete = server->server_metrics_.steps_closed_incomplete();
  if (options.durability != Durability::kNone) {
    JournalOptions& journal = engine_options.journal;
    journal.data_dir = options.data_dir;
    journal.durability = options.durability;
    journal.flush_interval = options.flush_interval;
    journal.compact_min_bytes = options.compact_min_bytes;
    journal.env = options.env;
    journal.metrics = server->server_metrics_.journal();
    QParamsServer* self = server.get();
    journal.on_failure = [self](const absl::Status&) {
      absl::MutexLock lock(&self->health_mu_);
      self->storage_failed_ = true;
      if (self->server_ != nullptr && !self->health_closed_) {
        self->server_->GetHealthCheckService()->SetServingStatus(kStorageHealthName, false);
      }
    };
  }
  QPARAMS_ASSIGN_OR_RETURN(server->engine_, Engine::Open(std::move(engine_options)));
  if (options.durability != Durability::kNone) {
    server->write_probe_ = std::make_unique<WriteProbe>(options.env, options.data_dir,
                                                        options.storage_probe_max_age);
  }
  server->server_metrics_.Watch(server->engine_.get());
  server->service_ =
      std::make_unique<QParamsServiceImpl>(server->engine_.get(), service_options);
  server->admin_service_ =
      std::make_unique<ClusterAdminServiceImpl>(server->engine_.get(), service_options);

  // Process-wide switches; both must be set before a server is built.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->admin_service_.get());
  ApplyTransportSettings(options.max_message_bytes, &builder);
  ApplyConnectionLimits(options, &builder);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<CallMetricsInterceptorFactory>(&server->server_metrics_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  {
    absl::MutexLock lock(&server->health_mu_);  // the journal's failure callback reads it
    server->server_ = builder.BuildAndStart();
  }
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (in use, or not a local address)"));
  }
  server->address_ = FormatHostPort(listen->host, server->port_);
  server->server_->GetHealthCheckService()->SetServingStatus(kServiceName, true);
  {
    absl::MutexLock lock(&server->health_mu_);
    server->server_->GetHealthCheckService()->SetServingStatus(kStorageHealthName,
                                                               !server->storage_failed_);
  }
  return server;
}

void QParamsServer::Shutdown(absl::Duration grace) {
  absl::MutexLock lock(&shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  if (server_ != nullptr) {
    // Health first, so probes see NOT_SERVING from the moment shutdown begins.
    {
      absl::MutexLock health_lock(&health_mu_);
      health_closed_ = true;
      server_->GetHealthCheckService()->Shutdown();
    }
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  }
  if (engine_ != nullptr) {
    if (absl::Status s = engine_->Close(); !s.ok()) LogError(s.message());
  }
}

void QParamsServer::Wait() { server_->Wait(); }

absl::Status QParamsServer::Readiness() {
  {
    absl::MutexLock lock(&health_mu_);
    if (health_closed_) {
      return absl::UnavailableError(
          "shutting down: health is NOT_SERVING, in-flight calls are draining");
    }
  }
  QPARAMS_RETURN_IF_ERROR(engine_->log().health());
  if (write_probe_ != nullptr) {
    if (absl::Status probe = write_probe_->Check(); !probe.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the data directory does not take writes (", probe.message(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status QParamsServer::Liveness() const {
  if (absl::Status journal = engine_->log().health(); !journal.ok()) {
    return absl::UnavailableError(absl::StrCat("only a restart helps: ", journal.message()));
  }
  return absl::OkStatus();
}

}  // namespace qparams
