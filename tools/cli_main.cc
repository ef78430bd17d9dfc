// qparams-cli: the command-line client of a qparams server. The flags are defined
// here; the commands live in qparams_cli_lib (cli.h).

#include <cstdlib>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "common/flags.h"
#include "grpc/support/log.h"
#include "tools/cli.h"

namespace {

void DiscardLog(gpr_log_func_args*) {}

std::string DefaultTarget() {
  const char* env = std::getenv("QPARAMS_TARGET");
  return env != nullptr && *env != '\0' ? env : "127.0.0.1:50051";
}

}  // namespace

// Global flags.
ABSL_FLAG(std::string, target, DefaultTarget(),
          "The server, host:port (or any gRPC target). Default: $QPARAMS_TARGET if set, "
          "else 127.0.0.1:50051");
ABSL_FLAG(std::string, format, "json",
          "Output: json (each response in protobuf's JSON mapping) or table");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30),
          "Deadline of each call (of the whole stream for observe), e.g. 500ms, 30s, 2m");
ABSL_FLAG(absl::Duration, retry_total, absl::Seconds(30),
          "Observations that fail with UNAVAILABLE or DEADLINE_EXCEEDED are sent again with "
          "the same idempotency key while the next attempt starts within this time of the "
          "first (docs/retries.md); 0s: no retries");

// Connection security.
ABSL_FLAG(bool, tls, false,
          "Connect over TLS, verifying the server against the system's root certificates "
          "(implied by --tls_ca, --tls_cert and --tls_key)");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the root certificate(s) to verify the server with, instead of the "
          "system's; implies TLS");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate chain, for a server that requires client "
          "certificates (mutual TLS); with --tls_key; implies TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the private key of --tls_cert; implies TLS");
ABSL_FLAG(std::string, tls_server_name, "",
          "With TLS: the name the server's certificate must carry, instead of --target's "
          "host (e.g. localhost for --target=127.0.0.1:50051)");
ABSL_FLAG(std::string, replica, "",
          "Sharded deployments: address every call to this replica (its name in the slot "
          "map), directly or through the balancer, and never split a call over replicas; "
          "e.g. to list one replica's sessions");
ABSL_FLAG(std::string, replicas, "",
          "slotmap push: the replicas to give the map, NAME (through --target, addressed by "
          "name) or NAME=HOST:PORT (straight), comma-separated; empty: every replica of the new "
          "map and of the current topology");
ABSL_FLAG(std::string, haproxy_admin, "",
          "slotmap push: HAProxy runtime API sockets (a UNIX socket path, or HOST:PORT), "
          "comma-separated, whose slot map is replaced after the replicas took it");
ABSL_FLAG(std::string, haproxy_map, "",
          "slotmap push: the slot map's name in HAProxy (the file it loaded); empty: its only "
          "map");
ABSL_FLAG(std::string, haproxy_server, "",
          "slotmap push: spare backends to make ready first, NAME=HOST:PORT[:CHECK_PORT], "
          "comma-separated (set server NAME/NAME addr, check-port, state ready)");
ABSL_FLAG(std::string, token, "",
          "Bearer token, sent as 'authorization: Bearer TOKEN' on every call but health. "
          "Empty: the one of --token_file, else $QPARAMS_TOKEN if set (preferable: a command "
          "line is visible to other users), else none");
ABSL_FLAG(std::string, token_file, "",
          "A file holding the bearer token (its surrounding whitespace ignored), e.g. a "
          "mounted Kubernetes Secret; not with --token");

// Command options.
ABSL_FLAG(bool, resume, false,
          "reshard: continue the move of the slots that the replicas' states show under way");
ABSL_FLAG(bool, abort, false, "reshard: roll back the move under way (before its switch)");
ABSL_FLAG(bool, stop_before_switch, false,
          "reshard: stop once the slots are copied (outcome awaiting_switch), leaving the new "
          "map to the operator; --resume finishes once the target and the source serve it");
ABSL_FLAG(std::string, replica_addresses, "",
          "reshard: NAME=HOST:PORT,... the replicas to reach directly instead of through "
          "--target (the balancer), each call addressed to its replica either way");
// The calculators come from the registry, so that the list is every one there is.
ABSL_FLAG(std::string, calculator, "", qparams::cli::CalculatorFlagHelp());
ABSL_FLAG(std::optional<double>, averaging_constant, std::nullopt,
          "create: the moving_average constant, 0 < c <= 1; sent only if given (server "
          "default 0.01)");
ABSL_FLAG(std::string, filter, "",
          "list, group list: only sessions (groups) whose names start with this");
ABSL_FLAG(int, page_size, 0,
          "list, group list: sessions (groups) per page; 0 = the server's default (50)");
ABSL_FLAG(std::string, page_token, "", "list: the page after the one that returned this token");
ABSL_FLAG(std::string, members, "",
          "group create: the member sessions, comma-separated, in order (1 to 1024)");
ABSL_FLAG(std::string, share, "",
          "group create: global_amax (NVFP4: one global scale from the largest member amax) "
          "or union_range (per_tensor: one qparams from the union of the members' ranges)");
ABSL_FLAG(bool, fill_uncalibrated, false,
          "group create (global_amax): uncalibrated members take the group's global scale "
          "once one member is calibrated, instead of leaving the group uninitialized");
ABSL_FLAG(std::string, prefix, "",
          "export, report: the sessions whose names start with this (stripped from the "
          "exported tensor names)");
ABSL_FLAG(std::string, output, "",
          "export: the file to write (also -o); empty = stdout. histogram: the .npy file of "
          "the counts");
ABSL_FLAG(bool, allow_uninitialized, false,
          "export: leave out the sessions that never saw data instead of failing "
          "(also --allow-uninitialized)");
ABSL_FLAG(std::string, html, "",
          "report: also write a self-contained HTML page with a plot per session to this file");
ABSL_FLAG(bool, reduce_locally, false,
          "observe: send each file's per-block min/max under the session's granularity "
          "instead of the whole tensor (also --reduce-locally)");
ABSL_FLAG(std::string, dtype, "",
          "compute, observe: the dtype to read .npy files as; bfloat16 reads '<u2' or '<i2' "
          "data as bf16 bits. Empty = the file's own");

// Spec flags (compute, create).
ABSL_FLAG(std::string, spec, "",
          "A whole QuantSpec in protobuf's JSON mapping, e.g. '{\"dtype\": \"int4\"}'; the "
          "flags below override its fields");
ABSL_FLAG(std::string, quant_dtype, "",
          "Quantized dtype: int8 (server default), uint8, int4, uint4, intN/uintN (N in 1..8), "
          "float8_e4m3fn, float8_e5m2, float4_e2m1fn_x2");
ABSL_FLAG(std::string, qscheme, "",
          "symmetric (server default), asymmetric or symmetric_with_clipping");
ABSL_FLAG(std::string, granularity, "",
          "per_tensor (server default), per_channel:AXIS, per_block:AXIS:SIZE or "
          "per_block:B0,B1,... (-1 = the whole dim)");
ABSL_FLAG(std::string, quant_target, "", "weight (server default) or activation");
ABSL_FLAG(std::optional<double>, quant_min, std::nullopt,
          "Lowest quantized value; with --quant_max, else derived from the dtype");
ABSL_FLAG(std::optional<double>, quant_max, std::nullopt,
          "Highest quantized value; with --quant_min, else derived from the dtype");
ABSL_FLAG(std::optional<double>, float_range_min, std::nullopt,
          "Fixed lower bound of the float range; unset = observed");
ABSL_FLAG(std::optional<double>, float_range_max, std::nullopt,
          "Fixed upper bound of the float range; unset = observed");
ABSL_FLAG(std::string, scale_dtype, "",
          "float8_e8m0fnu (alias float8_e8m0) for power-of-two scales, or float8_e4m3fn for "
          "NVFP4 scales (float4_e2m1fn_x2, per_block); unset = float32 (e8m0 for "
          "float4_e2m1fn_x2)");
ABSL_FLAG(std::string, convention, "",
          "with --scale_dtype=float8_e4m3fn: compressed_tensors (server default) or modelopt");

ABSL_FLAG(std::optional<int>, num_bins, std::nullopt,
          "create (percentile, entropy, mse): histogram bins, a power of two in [256, 65536]; "
          "unset = 4096");
ABSL_FLAG(std::optional<double>, percentile, std::nullopt,
          "create (percentile): the percentile of |x| to clip at, 0 < P <= 100; unset = 99.99");
ABSL_FLAG(std::optional<int>, start_bin, std::nullopt,
          "create (entropy, mse): the first candidate bin count; unset = 128");
ABSL_FLAG(std::optional<int>, stride, std::nullopt,
          "create (entropy, mse): the step between candidates; unset = 1");
ABSL_FLAG(bool, skip_zeros, false,
          "create (percentile, entropy, mse): leave exact zeros out of the search");
ABSL_FLAG(std::string, nonfinite, "",
          "create (percentile, entropy, mse): reject (default) or ignore NaN and +-Inf");

int main(int argc, char** argv) {
  namespace cli = qparams::cli;
  absl::SetProgramUsageMessage(cli::UsageMessage());
  // --help lists the flags of this file only, named by its path in the repository.
  absl::FlagsUsageConfig config;
  config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "tools/cli_main.cc");
  };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.normalize_filename = [](absl::string_view file) {
    const size_t tools = file.rfind("tools/");
    return std::string(tools == absl::string_view::npos ? file : file.substr(tools));
  };
  // --version: the project's version, written once in CMakeLists.txt's project().
  config.version_string = [] { return std::string("qparams-cli " QPARAMS_VERSION "\n"); };
  absl::SetFlagsUsageConfig(config);

  // gRPC's own log lines (a failed TLS handshake, say) would come before the one
  // "error: CODE: message" line, which carries the same reason; setting
  // GRPC_VERBOSITY brings them back.
  if (std::getenv("GRPC_VERBOSITY") == nullptr) gpr_set_log_function(DiscardLog);

  std::vector<std::string> args(argv, argv + argc);
  if (absl::Status status = cli::NormalizeFlags(args); !status.ok()) {
    std::cerr << "error: INVALID_ARGUMENT: " << status.message() << "\n";
    return cli::kExitUsage;
  }
  std::vector<char*> normalized;
  for (std::string& arg : args) normalized.push_back(arg.data());
  const std::vector<char*> positional =
      qparams::ParseFlags(static_cast<int>(normalized.size()), normalized.data());

  cli::Options options;
  options.target = absl::GetFlag(FLAGS_target);
  options.format = absl::GetFlag(FLAGS_format);
  options.timeout = absl::GetFlag(FLAGS_timeout);
  options.retry_total = absl::GetFlag(FLAGS_retry_total);
  options.calculator = absl::GetFlag(FLAGS_calculator);
  options.averaging_constant = absl::GetFlag(FLAGS_averaging_constant);
  options.filter = absl::GetFlag(FLAGS_filter);
  options.prefix = absl::GetFlag(FLAGS_prefix);
  options.output = absl::GetFlag(FLAGS_output);
  options.allow_uninitialized = absl::GetFlag(FLAGS_allow_uninitialized);
  options.html = absl::GetFlag(FLAGS_html);
  options.page_size = absl::GetFlag(FLAGS_page_size);
  options.page_token = absl::GetFlag(FLAGS_page_token);
  options.members = absl::GetFlag(FLAGS_members);
  options.share = absl::GetFlag(FLAGS_share);
  options.fill_uncalibrated = absl::GetFlag(FLAGS_fill_uncalibrated);
  options.reduce_locally = absl::GetFlag(FLAGS_reduce_locally);
  options.dtype = absl::GetFlag(FLAGS_dtype);
  options.spec.spec_json = absl::GetFlag(FLAGS_spec);
  options.spec.quant_dtype = absl::GetFlag(FLAGS_quant_dtype);
  options.spec.qscheme = absl::GetFlag(FLAGS_qscheme);
  options.spec.granularity = absl::GetFlag(FLAGS_granularity);
  options.spec.target = absl::GetFlag(FLAGS_quant_target);
  options.spec.quant_min = absl::GetFlag(FLAGS_quant_min);
  options.spec.quant_max = absl::GetFlag(FLAGS_quant_max);
  options.spec.float_range_min = absl::GetFlag(FLAGS_float_range_min);
  options.spec.float_range_max = absl::GetFlag(FLAGS_float_range_max);
  options.spec.scale_dtype = absl::GetFlag(FLAGS_scale_dtype);
  options.spec.convention = absl::GetFlag(FLAGS_convention);
  options.histogram.num_bins = absl::GetFlag(FLAGS_num_bins);
  options.histogram.percentile = absl::GetFlag(FLAGS_percentile);
  options.histogram.start_bin = absl::GetFlag(FLAGS_start_bin);
  options.histogram.stride = absl::GetFlag(FLAGS_stride);
  options.histogram.skip_zeros = absl::GetFlag(FLAGS_skip_zeros);
  options.histogram.nonfinite = absl::GetFlag(FLAGS_nonfinite);
  options.tls = absl::GetFlag(FLAGS_tls);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  options.replica = absl::GetFlag(FLAGS_replica);
  options.resume = absl::GetFlag(FLAGS_resume);
  options.abort = absl::GetFlag(FLAGS_abort);
  options.replica_addresses = absl::GetFlag(FLAGS_replica_addresses);
  options.stop_before_switch = absl::GetFlag(FLAGS_stop_before_switch);
  options.replicas = absl::GetFlag(FLAGS_replicas);
  options.haproxy_admin = absl::GetFlag(FLAGS_haproxy_admin);
  options.haproxy_map = absl::GetFlag(FLAGS_haproxy_map);
  options.haproxy_server = absl::GetFlag(FLAGS_haproxy_server);
  options.token = absl::GetFlag(FLAGS_token);
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = qparams::ReadFile(path);
    if (!options.token.empty() || !token.ok() || absl::StripAsciiWhitespace(*token).empty()) {
      std::cerr << "error: INVALID_ARGUMENT: --token_file: "
                << (!options.token.empty() ? "give --token or --token_file, not both"
                    : !token.ok()          ? std::string(token.status().message())
                                           : path + " is empty")
                << "\n";
      return cli::kExitUsage;
    }
    options.token = std::string(absl::StripAsciiWhitespace(*token));
  }
  // Read here rather than as the flag's default, which --help would print.
  if (const char* env = std::getenv("QPARAMS_TOKEN"); options.token.empty() && env != nullptr) {
    options.token = env;
  }

  return cli::Run(std::vector<std::string>(positional.begin() + 1, positional.end()), options,
                  std::cout, std::cerr);
}
