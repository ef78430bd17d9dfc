// qparams-server: parses flags, starts the server, and turns SIGTERM/SIGINT into a
// graceful shutdown.

#include <signal.h>
#include <string.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/range.h"
#include "core/tensor.h"
#include "server/log.h"
#include "server/server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "Address to serve on, host:port (port 0 picks a free one; the log says which).");
ABSL_FLAG(int64_t, max_sessions, 100000,
          "Most sessions the server holds; CreateSession beyond it is RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, max_message_bytes, 64 << 20,
          "Largest request accepted, in bytes; larger ones are RESOURCE_EXHAUSTED.");
ABSL_FLAG(int64_t, max_tensor_elements, qparams::kDefaultMaxTensorElements,
          "Most elements of one tensor (or of a range observation's input shape); more is "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int32_t, omp_threads, 0,
          "OpenMP threads for the range pass of one large tensor; 0 = OpenMP's default "
          "(OMP_NUM_THREADS, else the number of cores).");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(20),
          "On SIGTERM/SIGINT, how long in-flight calls may run before they are cancelled.");
ABSL_FLAG(bool, log_failed_rpcs, false,
          "Log every failed call: method, peer, status code and message.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "quantization parameters (scale, zero point, minval) as a gRPC service.\n"
      "Usage: qparams-server [--listen=127.0.0.1:50051] [flags]");
  // --help lists this file's flags (Abseil would look for a file named like the binary).
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view path) {
    return absl::EndsWith(path, "server/main.cc");
  };
  usage.contains_helpshort_flags = usage.contains_help_flags;
  absl::SetFlagsUsageConfig(usage);
  absl::ParseCommandLine(argc, argv);

  // Blocked before any thread starts, so every thread inherits the mask and only
  // sigwait below sees the signals.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  qparams::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.engine.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.service.max_tensor_elements = absl::GetFlag(FLAGS_max_tensor_elements);
  options.service.log_failed_rpcs = absl::GetFlag(FLAGS_log_failed_rpcs);
  const absl::Duration grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (options.engine.max_sessions < 0 || options.service.max_tensor_elements < 1 ||
      absl::GetFlag(FLAGS_omp_threads) < 0 || grace < absl::ZeroDuration()) {
    qparams::LogError(
        "--max_sessions and --omp_threads must be >= 0, --max_tensor_elements >= 1, "
        "--shutdown_grace >= 0");
    return 2;
  }
  qparams::SetRangeThreads(absl::GetFlag(FLAGS_omp_threads));

  qparams::LogInfo(absl::StrCat("starting: max_sessions=", options.engine.max_sessions,
                                " max_message_bytes=", options.max_message_bytes,
                                " max_tensor_elements=", options.service.max_tensor_elements,
                                " omp_threads=", absl::GetFlag(FLAGS_omp_threads),
                                " shutdown_grace=", absl::FormatDuration(grace)));
  absl::StatusOr<std::unique_ptr<qparams::QParamsServer>> server =
      qparams::QParamsServer::Start(options);
  if (!server.ok()) {
    qparams::LogError(absl::StrCat("cannot start: ", server.status().message()));
    return 1;
  }
  qparams::LogInfo(absl::StrCat("listening on ", (*server)->address()));

  std::thread signal_waiter([&signals, s = server->get(), grace] {
    int signal = 0;
    sigwait(&signals, &signal);
    qparams::LogInfo(absl::StrCat("received SIG", sigabbrev_np(signal), "; shutting down (grace ",
                                  absl::FormatDuration(grace), ")"));
    s->Shutdown(grace);
  });
  (*server)->Wait();
  signal_waiter.join();
  qparams::LogInfo("shut down");
  return 0;
}
