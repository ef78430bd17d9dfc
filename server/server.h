// A running qparams server: QParamsService (the data path), ClusterAdmin (cluster
// control), gRPC health and server reflection on one listening address, over an
// Engine that Engine::Open restored from (and journals to) a data directory; the
// server only wires them up. main() only parses flags and wires signals to Shutdown.

#ifndef QPARAMS_SERVER_SERVER_H_
#define QPARAMS_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "domain/engine.h"
#include "grpcpp/grpcpp.h"
#include "metrics/metrics.h"
#include "server/authorizer.h"
#include "server/cluster_admin_service.h"
#include "server/qparams_service.h"
#include "server/server_metrics.h"
#include "storage/journal.h"
#include "storage/write_probe.h"

namespace qparams {

struct ServerOptions {
  // host:port; port 0 picks a free port (see QParamsServer::port()).
  std::string listen = "127.0.0.1:50051";
  // gRPC's receive limit; larger requests fail with RESOURCE_EXHAUSTED.
  int max_message_bytes = 64 << 20;
  // OpenMP threads of one range pass (SetRangeThreads, process-wide); 0 = OpenMP's
  // default. One by default: a core reduces 20-50 GB/s, faster than any transport
  // delivers tensors, while OpenMP teams started from gRPC's threads oversubscribe
  // the cores and wait for workers the scheduler has not run yet (a 4 MiB pass took
  // 12 ms on two threads of a busy 2-core machine, 0.06 ms on one).
  int omp_threads = 1;
  EngineOptions engine;
  ServiceOptions service;  // both services'; its authorizer is set from the tokens files

  // Persistence: the directory (required unless durability is kNone), when a
  // mutation reaches the disk, and how often batched ones are fsynced.
  std::string data_dir;
  Durability durability = Durability::kNone;
  absl::Duration flush_interval = absl::Milliseconds(100);
  int64_t compact_min_bytes = int64_t{64} << 20;
  // The file system of the data directory (tests inject faults through it).
  Env* env = Env::Posix();
  // How long Readiness reuses a write probe of the data directory: health checks
  // from several balancers and the kubelet then cost one fsync a second at most.
  absl::Duration storage_probe_max_age = absl::Seconds(1);

  // TLS: PEM files of the server's certificate chain and key; with a client CA,
  // clients must present a certificate it signed (mutual TLS). Empty: plaintext.
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;

  // "TOKEN TENANT [expires=TIME]" lines (TokenAuthenticator): the tokens data
  // calls need. Empty: data calls are open.
  std::string auth_tokens_file;
  // "TOKEN NAME [expires=TIME]" lines: the tokens of cluster control (the slot map,
  // moves, record reading, import, drop). Empty: cluster control is off, every
  // admin call refused (server/authorizer.h).
  std::string admin_tokens_file;
  // Start refuses a non-loopback `listen` unless the server has TLS and
  // authenticates callers (tokens, or client certificates): set this to serve such
  // an address openly anyway (a loud warning is logged).
  bool allow_insecure = false;

  // Bounds on what one client holds (docs/security.md): concurrent calls per
  // connection (HTTP/2 streams; more wait in the client until one ends); a
  // connection without calls for max_connection_idle is closed (zero: never); a
  // connection that has not finished its (TLS and HTTP/2) handshake within
  // handshake_timeout is closed; keepalive pings every keepalive_time find peers
  // that vanished while holding a stream (20 s to answer).
  int max_concurrent_streams = 128;
  absl::Duration max_connection_idle = absl::Minutes(10);
  absl::Duration handshake_timeout = absl::Seconds(10);
  absl::Duration keepalive_time = absl::Minutes(1);
};

// Whether `host` (of a listen address) can only be reached from this machine:
// localhost, 127.0.0.0/8 or ::1.
bool IsLoopbackHost(absl::string_view host);

// The transport settings of a qparams server, on `builder`: requests of up to
// `max_message_bytes`, and HTTP/2 frames and stream windows sized for tensors of
// megabytes. gRPC's defaults (16 KiB frames, a 64 KiB window grown by probing) cut a
// 1 MiB tensor into 64 frames and stall the sender on window updates.
void ApplyTransportSettings(int max_message_bytes, grpc::ServerBuilder* builder);

class QParamsServer {
 public:
  // The name health reports for the service (besides "" for the whole server).
  static constexpr char kServiceName[] = "qparams.v1.QParamsService";
  // SERVING while the data directory takes mutations (or there is none);
  // NOT_SERVING once a storage failure made the server refuse them, until restart.
  static constexpr char kStorageHealthName[] = "qparams.storage";

  // Restores the sessions of the data directory, binds `options.listen` and starts
  // serving. INVALID_ARGUMENT for malformed options, FAILED_PRECONDITION for files
  // that cannot be read (data directory, certificates, tokens) and for a
  // non-loopback address without TLS and authentication (ServerOptions::
  // allow_insecure), UNAVAILABLE if the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<QParamsServer>> Start(const ServerOptions& options);

  ~QParamsServer();

  // The bound port and "host:port" address (with the port resolved).
  int port() const { return port_; }
  const std::string& address() const { return address_; }

  // Health turns NOT_SERVING, new calls are refused, in-flight calls get until
  // `grace` to finish and are cancelled after it; then the engine's journal is
  // fsynced and closed (Engine::Close). Returns when all that is done. Idempotent and thread-safe.
  void Shutdown(absl::Duration grace);

  // Blocks until Shutdown has completed.
  void Wait();

  // Whether the server should be sent calls (GET /healthz; docs/operations.md,
  // "Health checks"): OK while it is SERVING and its storage takes writes, else
  // UNAVAILABLE saying why: shutting down (from the moment Shutdown begins); the
  // journal broke (its failure: refused until restart); or, with a data directory,
  // a write probe (storage/write_probe.h, reused for storage_probe_max_age) failed,
  // which clears when a later probe succeeds. Thread-safe; it may block on the disk
  // for as long as the probe's fsync does.
  absl::Status Readiness() ABSL_LOCKS_EXCLUDED(health_mu_);

  // Whether the process is worth keeping (GET /livez): OK but once the journal
  // broke, when only a restart brings mutations back (UNAVAILABLE with its
  // failure). Draining and a failed probe are not reasons to restart. Thread-safe.
  absl::Status Liveness() const;

  Engine& engine() { return *engine_; }

  // Reads the tokens files again (SIGHUP); on an error the tokens in force stay.
  // Thread-safe.
  absl::Status ReloadTokens() { return authorizer_->Reload(); }

  // The server's metrics (server/server_metrics.h), recorded from the start whether
  // or not anything serves them; Render is thread-safe, until the server is
  // destroyed.
  const MetricsRegistry& metrics() const { return metrics_; }

 private:
  QParamsServer() : server_metrics_(&metrics_) {}

  // First, so that they outlive everything that records into them.
  MetricsRegistry metrics_;
  ServerMetrics server_metrics_;

  std::unique_ptr<Authorizer> authorizer_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<QParamsServiceImpl> service_;
  std::unique_ptr<ClusterAdminServiceImpl> admin_service_;
  std::unique_ptr<WriteProbe> write_probe_;  // with a journal only
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_;
  // Lock order: shutdown_mu_, then health_mu_ (the engine's journal, closed under
  // shutdown_mu_, reports a failure under health_mu_).
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  absl::Mutex health_mu_ ABSL_ACQUIRED_AFTER(shutdown_mu_);
  // Set by the journal's failure callback, from any thread.
  bool storage_failed_ ABSL_GUARDED_BY(health_mu_) = false;
  bool health_closed_ ABSL_GUARDED_BY(health_mu_) = false;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SERVER_H_
