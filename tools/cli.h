// qparams-cli: the commands, their arguments and their output, apart from the absl
// flags that feed them (defined in cli_main.cc), so that every piece can be tested.
//
// Defined in cli.cc (Run, the command table and the help) and cli_flags.cc (the
// flags' syntax); the commands live in cli_*.cc by family (cli_internal.h).
//
// Target qparams_cli_lib (with partial_file.h; tools/README.md): the top of the
// client's targets, composing the RPC client, .npy files and the report; nothing
// below it includes this.

#ifndef QPARAMS_TOOLS_CLI_H_
#define QPARAMS_TOOLS_CLI_H_

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::cli {

// Exit statuses.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // a call, a file or an observation failed
inline constexpr int kExitUsage = 2;   // the command line is wrong
// A listing or report of a sharded deployment printed what the replicas that
// answered hold; the replicas that could not be read are named on stderr.
inline constexpr int kExitIncomplete = 3;

// The spec flags of `compute` and `create`: a whole spec as JSON, then overrides of
// its fields. An empty string or an unset optional means "not given".
struct SpecFlags {
  std::string spec_json;    // --spec
  std::string quant_dtype;  // --quant_dtype
  std::string qscheme;      // --qscheme
  std::string granularity;  // --granularity
  std::string target;       // --quant_target
  std::optional<double> quant_min;
  std::optional<double> quant_max;
  std::optional<double> float_range_min;
  std::optional<double> float_range_max;
  std::string scale_dtype;  // --scale_dtype
  std::string convention;   // --convention (NVFP4, scale_dtype float8_e4m3fn)
};

// The histogram parameters of `create` for percentile, entropy and mse
// (docs/histograms.md). Unset (or false, or "") means "not given".
struct HistogramFlags {
  std::optional<int> num_bins;       // --num_bins
  std::optional<double> percentile;  // --percentile
  std::optional<int> start_bin;      // --start_bin
  std::optional<int> stride;         // --stride
  bool skip_zeros = false;           // --skip_zeros
  std::string nonfinite;             // --nonfinite: "reject" or "ignore"
};

// Every flag, parsed.
struct Options {
  std::string target = "127.0.0.1:50051";
  std::string format = "json";  // "json" or "table"
  absl::Duration timeout = absl::Seconds(30);
  absl::Duration retry_total = absl::Seconds(30);  // observations' retries (ClientOptions)
  std::string calculator;
  std::optional<double> averaging_constant;
  std::string filter;              // list, group list: a name prefix
  int page_size = 0;               // list, group list: 0 = the server's default
  std::string page_token;          // list only: group list follows every page
  std::string members;             // group create: session names, comma-separated
  std::string share;               // group create: global_amax or union_range
  bool fill_uncalibrated = false;  // group create
  bool reduce_locally = false;
  std::string prefix;                // export, report: the session-name prefix
  std::string output;                // export, histogram: -o/--output FILE ("" = stdout)
  bool allow_uninitialized = false;  // export: leave uninitialized sessions out
  std::string html;                  // report: --html FILE, the self-contained page
  std::string dtype;                 // "" = as the .npy file says
  SpecFlags spec;
  HistogramFlags histogram;
  bool resume = false;            // reshard: continue the move under way
  bool abort = false;             // reshard: roll it back
  std::string replica_addresses;  // reshard: NAME=HOST:PORT,... reached directly, not via --target
  bool stop_before_switch = false;  // reshard: stop once copied, leaving the switch to the operator

  // Transport security: TLS if `tls` is set or any of the three files is given.
  bool tls = false;             // --tls: TLS with the default (system) roots
  std::string tls_ca;           // --tls_ca: PEM roots to verify the server with
  std::string tls_cert;         // --tls_cert: client certificate (mutual TLS)
  std::string tls_key;          // --tls_key: its private key
  std::string tls_server_name;  // --tls_server_name: the name the server's cert must carry
  std::string replica;          // --replica: address every call to this replica ("" = route)
  // slotmap push: --replicas (NAME[=HOST:PORT],...; "" = every replica of the new map
  // and of the current topology), --haproxy_admin (runtime API sockets, comma-
  // separated), --haproxy_map (the map's name in HAProxy; "" = its only one),
  // --haproxy_server (spare backends: NAME=HOST:PORT[:CHECK_PORT],...).
  std::string replicas;
  std::string haproxy_admin;
  std::string haproxy_map;
  std::string haproxy_server;
  // --token (else $QPARAMS_TOKEN): sent as a bearer token on every call but health;
  // "" sends none.
  std::string token;
};

// What --help prints ahead of the flags: the synopsis, every command (and every
// group subcommand), and the syntax the flags share.
std::string UsageMessage();

// The help of --calculator: the compute calculators and the session calculators,
// taken from the core's calculator registry (the server's), so that it lists every
// one.
std::string CalculatorFlagHelp();

// Prepares `argv` (argv[0] first) for absl::ParseCommandLine: rewrites every flag name
// spelled with dashes (`--reduce-locally`) with absl's underscores, and checks that
// each flag exists and that its value parses (which sets it; ParseCommandLine sets
// it again), so that these mistakes are usage errors like any other instead of
// absl's own exit(1). absl's built-in flags (--help, --flagfile, ...) pass unchecked.
// INVALID_ARGUMENT naming the flag otherwise.
absl::Status NormalizeFlags(std::vector<std::string>& argv);

// Parses GRANULARITY: "per_tensor", "per_channel:AXIS", "per_block:AXIS:SIZE"
// (single-axis) or "per_block:B0,B1,..." (multi-axis, one size per dim, -1 = the
// whole dim). Only the syntax is checked here; the server applies the rules.
// INVALID_ARGUMENT otherwise.
absl::StatusOr<v1::Granularity> ParseGranularity(absl::string_view text);

// The spec the spec flags describe: --spec parsed from protobuf's JSON mapping, then
// each override given. INVALID_ARGUMENT naming the flag for malformed JSON or an
// unknown value (dtype, qscheme, granularity syntax, target, scale dtype).
absl::StatusOr<v1::QuantSpec> BuildSpec(const SpecFlags& flags);

// The HistogramParams the histogram flags describe, or nullopt when none is given
// (the server then takes every default; a calculator that takes none refuses any).
// INVALID_ARGUMENT naming --nonfinite for a value other than reject or ignore; the
// server checks the rest.
absl::StatusOr<std::optional<v1::HistogramParams>> BuildHistogramParams(
    const HistogramFlags& flags);

// Runs `args` (COMMAND [ARGS...], the flags already parsed into `options`) against
// the server at options.target. Results go to `out` (JSON or a table), errors to
// `err` as "error: CODE_NAME: message". Returns the exit status: a usage error (2)
// also for a client certificate without its key (or the reverse) and for
// --tls_server_name without TLS; a failure (1) for a TLS file that cannot be read.
int Run(const std::vector<std::string>& args, const Options& options, std::ostream& out,
        std::ostream& err);

}  // namespace qparams::cli

#endif  // QPARAMS_TOOLS_CLI_H_
