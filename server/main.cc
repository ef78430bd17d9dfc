// qparams-server: parses flags, starts the server, and turns SIGTERM/SIGINT into a
// graceful shutdown.

#include <signal.h>
#include <string.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/flags.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/slot_map.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "grpcpp/security/credentials.h"
#include "metrics/metrics_http.h"
#include "server/process_tuning.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve on, host:port (port 0 picks a free one; the log says which).");
ABSL_FLAG(int64_t, max_sessions, 100000,
          "Most sessions the server holds; CreateSession beyond it is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_scale_groups, qparams::EngineOptions().max_scale_groups,
          "Most scale groups the server holds (all tenants together), >= 1; "
          "CreateScaleGroup beyond it is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20,
          "Largest request accepted, in bytes; larger ones are RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_tensor_elements, qparams::kDefaultMaxTensorElements,
          "Most elements of one tensor (or of a range observation's input shape); more is "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, omp_threads, qparams::ServerOptions().omp_threads,
          "OpenMP threads for the range pass of one large tensor; 0 = OpenMP's default "
          "(OMP_NUM_THREADS, else the number of cores). One core outpaces the transport, "
          "and parallel passes from many gRPC threads oversubscribe the cores.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(20),
          "On SIGTERM/SIGINT, how long in-flight calls may run before they are cancelled.");
ABSL_FLAG(bool, log_failed_rpcs, false,
          "Log every failed call: method, peer, status code and message.");
ABSL_FLAG(std::string, data_dir, "",
          "Directory of the session journal and snapshots; sessions and scale groups are "
          "restored from it at start. Empty: they live in memory only.");
ABSL_FLAG(std::string, durability, "batched",
          "With --data_dir, when an acknowledged mutation is on disk: always (fsync before "
          "the response), batched (within --flush_interval, and at shutdown) or none "
          "(memory only).");
ABSL_FLAG(absl::Duration, flush_interval, absl::Milliseconds(100),
          "--durability=batched: how often the journal is fsynced.");
ABSL_FLAG(absl::Duration, session_ttl, absl::ZeroDuration(),
          "Evict sessions no call has named for this long (0 = never); later calls on an "
          "evicted name answer NOT_FOUND saying so.");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the server; enables TLS.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed (mutual TLS).");
ABSL_FLAG(std::string, replica_id, "",
          "Sharding: this replica's name in --slot_map; it then owns only the sessions of its "
          "slots (none yet, for a new replica waiting for a move). Both or neither.");
ABSL_FLAG(std::string, slot_map, "",
          "Sharding: the slot map file (\"LOW:HIGH REPLICA\" lines, HAProxy's map_int syntax, "
          "and \"# epoch N\") every replica and the balancer read. SIGHUP reads it again; a "
          "map persisted in --data_dir with a greater epoch wins at start. Both or neither.");
ABSL_FLAG(std::string, cluster_address, "",
          "Sharding: the deployment's router (HAProxy; a gRPC target, HOST:PORT or unix:PATH) "
          "through which this replica reaches every replica of its slot map by name, to "
          "answer a client's listing, read or export for all of them. Unset: it answers for "
          "its own slots only.");
ABSL_FLAG(std::string, cluster_tls_ca, "",
          "Sharding: PEM CA bundle that --cluster_address's certificate is checked against "
          "(TLS, as HAProxy serves clients in every shipped form); unset: plaintext (h2c).");
ABSL_FLAG(std::string, metrics_listen, "",
          "Serve Prometheus metrics over HTTP at GET /metrics on this host:port (e.g. "
          "0.0.0.0:9100; port 0 picks a free one, the log says which), and health checks: "
          "GET /healthz is 200 while the server is SERVING and its storage takes writes, "
          "else 503 saying why; GET /livez is 503 only once a restart is needed. Empty: no "
          "metrics server.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "File of \"TOKEN TENANT [expires=TIME]\" lines; every data call must then send "
          "\"authorization: Bearer TOKEN\" and sees only its tenant's sessions. Empty: data "
          "calls are open. SIGHUP reads it again.");
ABSL_FLAG(std::string, admin_tokens_file, "",
          "File of \"TOKEN NAME [expires=TIME]\" lines: the bearer tokens of cluster control "
          "(SetSlotMap, SetSlotState, ReadSlotRecords, ImportSessions, DropSlots). Empty: "
          "cluster control is off, those calls are PERMISSION_DENIED. SIGHUP reads it again.");
ABSL_FLAG(bool, allow_insecure, false,
          "Serve a non-loopback --listen address without TLS or without authentication "
          "(tokens or client certificates); without this flag the server refuses to start so.");
ABSL_FLAG(int32_t, max_concurrent_streams, qparams::ServerOptions().max_concurrent_streams,
          "Most calls one connection has in flight (HTTP/2 streams); more wait in the client.");
ABSL_FLAG(absl::Duration, max_connection_idle, qparams::ServerOptions().max_connection_idle,
          "Close a connection without calls for this long (0 = never); clients reconnect.");
ABSL_FLAG(absl::Duration, handshake_timeout, qparams::ServerOptions().handshake_timeout,
          "Close a connection whose TLS and HTTP/2 handshake has not finished within this.");
ABSL_FLAG(absl::Duration, keepalive_time, qparams::ServerOptions().keepalive_time,
          "Ping each connection this often; a peer that does not answer within 20 s is "
          "dropped with its calls.");

namespace {

// What the flags ask for, each checked here once (the server's own options are
// checked by QParamsServer::Start).
struct Flags {
  qparams::ServerOptions server;
  absl::Duration grace;
  std::optional<qparams::HostPort> metrics_listen;
};

// --replica_id and --slot_map into `engine`: both or neither; the map may give the
// replica no slot (a new replica, waiting for slots to move to it).
absl::Status ApplySharding(qparams::EngineOptions& engine) {
  const std::string replica_id = absl::GetFlag(FLAGS_replica_id);
  const std::string slot_map_path = absl::GetFlag(FLAGS_slot_map);
  if (replica_id.empty() != slot_map_path.empty()) {
    return absl::InvalidArgumentError(
        "--replica_id and --slot_map go together: give both or neither");
  }
  if (slot_map_path.empty()) {
    if (!absl::GetFlag(FLAGS_cluster_address).empty()) {
      return absl::InvalidArgumentError("--cluster_address needs --replica_id and --slot_map");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<qparams::SlotMap> slot_map = qparams::SlotMap::Load(slot_map_path);
  if (!slot_map.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slot_map: ", slot_map.status().message()));
  }
  if (!qparams::SlotMap::ValidReplicaName(replica_id)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--replica_id: \"", replica_id, "\" is not 1 to 64 characters of [a-zA-Z0-9._-]"));
  }
  std::vector<std::string> mine;
  for (const qparams::SlotMap::Range& range : slot_map->Ranges()) {
    if (range.replica == replica_id) mine.push_back(absl::StrCat(range.low, ":", range.high));
  }
  if (mine.empty()) {
    qparams::LogWarning(absl::StrCat(
        "replica ", replica_id, " owns no slot in ", slot_map_path, " (epoch ",
        slot_map->epoch(), "; its replicas: ", absl::StrJoin(slot_map->replicas(), ", "),
        "): it refuses every session until a map gives it slots (SetSlotMap, SIGHUP)"));
  } else {
    qparams::LogInfo(absl::StrCat("replica ", replica_id, " of ", slot_map->replicas().size(),
                                  ", owning slots ", absl::StrJoin(mine, " "), " (epoch ",
                                  slot_map->epoch(), ")"));
  }
  engine.slot_map = std::make_shared<const qparams::SlotMap>(*std::move(slot_map));
  engine.replica_id = replica_id;
  return absl::OkStatus();
}

// The flags, checked; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<Flags> ReadFlags() {
  Flags flags;
  qparams::ServerOptions& options = flags.server;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.engine.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.engine.max_scale_groups = absl::GetFlag(FLAGS_max_scale_groups);
  options.service.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  options.service.log_failed_rpcs = absl::GetFlag(FLAGS_log_failed_rpcs);
  options.engine.session_ttl = absl::GetFlag(FLAGS_session_ttl);
  options.data_dir = absl::GetFlag(FLAGS_data_dir);
  options.flush_interval = absl::GetFlag(FLAGS_flush_interval);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.admin_tokens_file = absl::GetFlag(FLAGS_admin_tokens_file);
  options.allow_insecure = absl::GetFlag(FLAGS_allow_insecure);
  // Checked by QParamsServer::Start.
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  options.handshake_timeout = absl::GetFlag(FLAGS_handshake_timeout);
  options.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  absl::StatusOr<qparams::Durability> durability =
      qparams::ParseDurability(absl::GetFlag(FLAGS_durability));
  if (!durability.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--durability: ", durability.status().message()));
  }
  options.durability = options.data_dir.empty() && *durability == qparams::Durability::kBatched
                           ? qparams::Durability::kNone  // the default, without a directory
                           : *durability;
  flags.grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (options.engine.max_sessions < 0 || options.service.max_tensor_elements < 1 ||
      flags.grace < absl::ZeroDuration() || options.flush_interval <= absl::ZeroDuration() ||
      options.engine.session_ttl < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--max_sessions must be >= 0, --max_tensor_elements >= 1, "
        "--shutdown_grace and --session_ttl >= 0, --flush_interval > 0");
  }
  if (options.engine.max_scale_groups < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_scale_groups is ", options.engine.max_scale_groups, "; it must be >= 1"));
  }
  // Checked by QParamsServer::Start, with --listen and --max_message_bytes.
  options.omp_threads = absl::GetFlag(FLAGS_omp_threads);
  if (const std::string flag = absl::GetFlag(FLAGS_metrics_listen); !flag.empty()) {
    absl::StatusOr<qparams::HostPort> parsed = qparams::ParseHostPort(flag);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_listen: ", parsed.status().message()));
    }
    flags.metrics_listen = *std::move(parsed);
  }
  QPARAMS_RETURN_IF_ERROR(ApplySharding(options.engine));
  options.service.cluster_address = absl::GetFlag(FLAGS_cluster_address);
  if (const std::string ca = absl::GetFlag(FLAGS_cluster_tls_ca); !ca.empty()) {
    absl::StatusOr<std::string> pem = qparams::ReadFile(ca);
    if (!pem.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cluster_tls_ca: ", pem.status().message()));
    }
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = *std::move(pem);
    options.service.cluster_credentials = grpc::SslCredentials(tls);
  }
  return flags;
}

// The settings and what is switched off, before the server starts.
void LogStart(const Flags& flags) {
  const qparams::ServerOptions& options = flags.server;
  qparams::LogInfo(absl::StrCat("starting: max_sessions=", options.engine.max_sessions,
                                " max_scale_groups=", options.engine.max_scale_groups,
                                " max_message_bytes=", options.max_message_bytes,
                                " max_tensor_elements=", options.service.max_tensor_elements,
                                " omp_threads=", options.omp_threads,
                                " shutdown_grace=", absl::FormatDuration(flags.grace),
                                " session_ttl=", absl::FormatDuration(options.engine.session_ttl)));
  if (options.durability == qparams::Durability::kNone) {
    qparams::LogWarning("no persistence (--data_dir unset or --durability=none): sessions "
                        "are lost when the server stops");
  }
  const bool open = options.auth_tokens_file.empty() && options.tls_client_ca.empty();
  const bool plaintext = options.tls_cert.empty();
  absl::StatusOr<qparams::HostPort> listen = qparams::ParseHostPort(options.listen);
  if (listen.ok() && !qparams::IsLoopbackHost(listen->host) && (open || plaintext)) {
    // Without --allow_insecure, QParamsServer::Start refuses to serve so, saying why.
    if (!options.allow_insecure) return;
    const std::string bar(78, '!');
    qparams::LogWarning(absl::StrCat(
        "\n", bar, "\n!! INSECURE: serving ", options.listen,
        ", reachable from other machines,\n",
        plaintext ? "!!   in plaintext: anyone on the path reads tensors and tokens;\n" : "",
        open ? "!!   without authentication: anyone who reaches the port reads, changes and "
               "deletes every session;\n"
             : "",
        "!! (--allow_insecure). See docs/security.md for TLS and tokens.\n", bar));
  } else {
    if (open) {
      qparams::LogWarning("no --auth_tokens_file: data calls are open, every caller reaches "
                          "every session");
    }
    if (plaintext) qparams::LogWarning("no --tls_cert: traffic is plaintext");
  }
  if (options.admin_tokens_file.empty()) {
    qparams::Log(
        options.engine.slot_map != nullptr ? qparams::LogLevel::kWarning : qparams::LogLevel::kInfo,
        "no --admin_tokens_file: cluster control (SetSlotMap, SetSlotState, ReadSlotRecords, "
        "ImportSessions, DropSlots) is off; this replica takes slot maps from --slot_map and "
        "SIGHUP only, and slot moves not at all");
  }
}

// SIGHUP: the tokens files read again (all or nothing: a file that does not parse
// leaves the tokens in force), and --slot_map given to the engine under its epoch
// rule (Engine::SetSlotMap logs what changed); a refusal is logged and changes nothing.
void Reload(qparams::QParamsServer& server) {
  if (absl::Status tokens = server.ReloadTokens(); !tokens.ok()) {
    qparams::LogError(absl::StrCat("received SIGHUP: tokens not reloaded, the former stay: ",
                                   tokens.message()));
  } else if (!absl::GetFlag(FLAGS_auth_tokens_file).empty() ||
             !absl::GetFlag(FLAGS_admin_tokens_file).empty()) {
    qparams::LogInfo("received SIGHUP: tokens files read again");
  }
  qparams::Engine& engine = server.engine();
  const std::string path = absl::GetFlag(FLAGS_slot_map);
  if (path.empty()) return;
  absl::StatusOr<qparams::SlotMap> map = qparams::SlotMap::Load(path);
  absl::Status status = map.ok()
                            ? engine.SetSlotMap(std::make_shared<const qparams::SlotMap>(*map))
                            : map.status();
  if (!status.ok()) {
    qparams::LogError(absl::StrCat("received SIGHUP: slot map ", path, " not taken: ",
                                   status.message()));
    return;
  }
  qparams::LogInfo(absl::StrCat("received SIGHUP: slot map ", path, " read, epoch ",
                                map->epoch()));
}

}  // namespace

int main(int argc, char** argv) {
  qparams::TuneProcessForServing();
  absl::SetProgramUsageMessage(
      "quantization parameters (scale, zero point, minval) as a gRPC service.\n"
      "Usage: qparams-server [--listen=127.0.0.1:50051] [flags]");
  // --help lists this file's flags (Abseil would look for a file named like the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  // --version: the project's version, written once in CMakeLists.txt's project().
  usage.version_string = [] { return std::string("qparams-server " QPARAMS_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);
  qparams::ParseFlags(argc, argv);

  // Blocked before any thread starts, so every thread inherits the mask and only
  // sigwait below sees the signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<Flags> flags = ReadFlags();
  if (!flags.ok()) {
    qparams::LogError(flags.status().message());
    return 2;
  }
  LogStart(*flags);
  const qparams::ServerOptions& options = flags->server;
  const absl::Duration grace = flags->grace;
  absl::StatusOr<std::unique_ptr<qparams::QParamsServer>> server =
      qparams::QParamsServer::Start(options);
  if (!server.ok()) {
    qparams::LogError(absl::StrCat("cannot start: ", server.status().message()));
    return 1;
  }
  qparams::LogInfo(absl::StrCat("listening on ", (*server)->address(),
                                options.tls_cert.empty() ? "" : " (TLS)",
                                options.tls_client_ca.empty() ? "" : " (client certificates required)",
                                options.auth_tokens_file.empty() ? "" : " (bearer tokens required)"));

  // After the gRPC server, whose metrics and health it serves; stopped once that has
  // shut down, so that health checks see 503 while it drains.
  std::unique_ptr<qparams::MetricsHttpServer> metrics;
  if (flags->metrics_listen.has_value()) {
    absl::StatusOr<std::unique_ptr<qparams::MetricsHttpServer>> started =
        qparams::MetricsHttpServer::Start(
            *flags->metrics_listen, &(*server)->metrics(),
            {[s = server->get()] { return s->Readiness(); },
             [s = server->get()] { return s->Liveness(); }});
    if (!started.ok()) {
      qparams::LogError(
          absl::StrCat("cannot serve metrics: --metrics_listen: ", started.status().message()));
      (*server)->Shutdown(absl::ZeroDuration());
      return 1;
    }
    metrics = *std::move(started);
    qparams::LogInfo(absl::StrCat("serving metrics on http://", metrics->address(),
                                  "/metrics, health on /healthz and /livez"));
  }

  std::thread signal_waiter([&signals, s = server->get(), grace] {
    int signal = 0;
    while (sigwait(&signals, &signal) == 0 && signal == SIGHUP) Reload(*s);
    qparams::LogInfo(absl::StrCat("received SIG", sigabbrev_np(signal), "; shutting down (grace ",
                                  absl::FormatDuration(grace), ")"));
    s->Shutdown(grace);
  });
  (*server)->Wait();
  signal_waiter.join();
  if (metrics != nullptr) metrics->Stop();
  qparams::LogInfo("shut down");
  return 0;
}
