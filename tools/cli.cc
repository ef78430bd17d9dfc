// The command table and Run, which dispatches a command line to its command
// (cli_internal.h), and --help's text, made from the same table.

#include "tools/cli.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "core/dtype.h"
#include "core/registry.h"
#include "tools/cli_internal.h"

namespace qparams::cli {
namespace {

// A command of the table, or a subcommand of one.
struct Command {
  absl::string_view name;
  absl::string_view args;  // the synopsis of its arguments
  size_t min_args;
  size_t max_args;
  int (*run)(Invocation&);               // null for a command of subcommands
  absl::string_view help;                // "$CALCULATORS" stands for the session calculators
  const Command* subcommands = nullptr;  // `name SUBCOMMAND ARGS...`
  size_t subcommand_count = 0;
};

constexpr size_t kAny = SIZE_MAX;

// clang-format off
constexpr Command kSlotMapCommands[] = {
  {"push", "FILE", 1, 1, SlotMapPush,
   "Give every replica the slot map FILE (SetSlotMap, an admin call: --token an\n"
   "admin token of the servers' --admin_tokens_file), each addressed by name through\n"
   "--target: those --replicas names (NAME, or NAME=HOST:PORT to reach it straight),\n"
   "by default every replica FILE names and every replica of the current topology.\n"
   "Then, once every replica took it, replace the map of each --haproxy_admin\n"
   "HAProxy (runtime API: prepare map, add map, commit map; --haproxy_map names it,\n"
   "by default its only map); --haproxy_server spares are made ready first. A replica\n"
   "takes a map of a greater epoch (\"# epoch N\"); the same map again changes\n"
   "nothing. Prints what each took; exits 1 if any failed."},
  {"show", "", 0, 0, SlotMapShow,
   "Show the slot map the answering replica serves (GetTopology; through the\n"
   "balancer any healthy replica, else --replica's): JSON, the topology;\n"
   "--format=table, the map file's text (\"# epoch N\", then LOW:HIGH REPLICA\n"
   "lines), to keep the file in step with the maps pushed (qparams-cli slotmap\n"
   "show --format=table > FILE)."},
};

constexpr Command kGroupCommands[] = {
  {"create", "NAME --members=A,B,... --share=global_amax|union_range [--fill_uncalibrated]",
   1, 1, GroupCreate,
   "Create a scale group of existing sessions of one resolved spec. global_amax:\n"
   "NVFP4 members share one global scale from the largest member amax;\n"
   "union_range: per_tensor members share the qparams of the union of their\n"
   "ranges. --fill_uncalibrated (global_amax) gives uncalibrated members the\n"
   "group's global scale once one member is calibrated. Changes no member."},
  {"get", "NAME", 1, 1, GroupGet, "Show a scale group: members, share, fill_uncalibrated."},
  {"list", "[--filter=PREFIX] [--page_size=N]", 0, 0, GroupList,
   "Every scale group whose name starts with --filter, by name, following the\n"
   "pages (of --page_size) to the last."},
  {"delete", "NAME", 1, 1, GroupDelete, "Delete a scale group; never its members."},
  {"qparams", "NAME", 1, 1, GroupQParams,
   "The group's shared result from its members' current ranges: initialized, the\n"
   "uncalibrated members; global_amax: amax, global_scale and each member's amax\n"
   "and qparams (its e4m3 block codes); union_range: min, max and the one qparams."},
};
// clang-format on

// clang-format off
constexpr Command kCommands[] = {
  {"calculators", "", 0, 0, Calculators,
   "List the calculators: registry key, stateful or not, description."},
  {"compute", "FILE.npy", 1, 1, Compute,
   "The qparams of one tensor, stored nowhere. --calculator: \"\" (= dynamic),\n"
   "dynamic or static; and the spec flags."},
  {"create", "NAME", 1, 1, Create,
   "Create a session. --calculator, a session calculator of the registry:\n"
   "$CALCULATORS;\n"
   "or \"\" (= default: static for weights, moving_average for activations).\n"
   "--averaging_constant (moving_average only); the histogram flags (percentile,\n"
   "entropy, mse); and the spec flags."},
  {"get", "NAME", 1, 1, Get, "Show a session: spec, state and cached qparams."},
  {"list", "", 0, 0, List,
   "List sessions by name, one page at a time: --filter (a name prefix),\n"
   "--page_size, --page_token (from the previous page)."},
  {"report", "", 0, 0, Report,
   "A coverage report of the sessions under --prefix: per session its calculator,\n"
   "spec, observations, initialized, non-finite count and the spread of its scales\n"
   "(min, median, max, max/min); JSON, or --format=table with the uninitialized\n"
   "sessions first. --html=FILE also writes one self-contained page: the\n"
   "uninitialized sessions, then a plot of each other's per-channel or per-block\n"
   "ranges and scales, or of a percentile, entropy or mse session's histogram of\n"
   "|x| (log scale) with its amax and max |x| marked."},
  {"steps", "[PREFIX]", 0, 1, Steps,
   "The progress of a training run's step-merged sessions (docs/qat.md): for each\n"
   "session under PREFIX (all without it), by name, its last applied step, its open\n"
   "steps with the ranks they wait for, and the steps closed incomplete by their\n"
   "timeout with the ranks they were closed without; then a summary: sessions,\n"
   "stepped sessions, the least and greatest last applied step, the sessions with\n"
   "steps closed incomplete, the ranks missing from them and the ranks the open\n"
   "steps wait for. A session never stepped shows as such."},
  {"delete", "NAME", 1, 1, Delete, "Delete a session."},
  {"observe", "NAME FILE.npy [FILE.npy ...]", 2, kAny, Observe,
   "One forward of the session per file, in order, all over one stream.\n"
   "--reduce-locally sends each file's per-block min/max (reduced here under the\n"
   "session's granularity), or for a percentile, entropy or mse session its\n"
   "histogram (binned here), instead of the tensor: the same qparams, far fewer\n"
   "bytes. Prints every response; exits 1 if any failed."},
  {"qparams", "NAME", 1, 1, GetQParams,
   "A session's cached qparams (and a histogram session's calibration: amax,\n"
   "bin_index, exponent, total_count)."},
  {"histogram", "NAME", 1, 1, GetHistogram,
   "The histogram of |x| of a percentile, entropy or mse session: num_bins,\n"
   "exponent (bin k holds k*2^exponent <= |x| < (k+1)*2^exponent), counts, side\n"
   "counts, min, max. --output=FILE (-o) writes the counts to FILE as a .npy\n"
   "uint64 array (np.load(FILE)) and leaves them out of what is printed;\n"
   "--format=table lists the non-empty bins."},
  {"export", "", 0, 0, Export,
   "Every session under --prefix in a deployment format (--format=aimet: AIMET\n"
   "encodings 1.0.0; onnx: QuantizeLinear inputs, AIMET encodings 2.0.0's layout;\n"
   "compressed-tensors: scale tensors and quantization_config, NVFP4's too;\n"
   "modelopt: NVFP4 scale tensors and hf_quant_config.json), to -o FILE or\n"
   "stdout. Names lose the prefix. Fails listing the sessions that never saw data\n"
   "unless --allow-uninitialized leaves them out, and names any session the format\n"
   "cannot express. See docs/exports.md."},
  {"export-mode", "NAME on|off", 2, 2, ExportMode,
   "Freeze (on) or unfreeze (off) a session's qparams."},
  {"granularity", "NAME GRANULARITY", 2, 2, SetGranularity,
   "Change the granularity of a session that has not computed a forward yet."},
  {"health", "[SERVICE]", 0, 1, Health,
   "The health of the server (or of SERVICE, e.g. qparams.v1.QParamsService):\n"
   "SERVING, NOT_SERVING, ...; exits 0 only if SERVING. Sends no token."},
  {"slot", "NAME [NAME ...]", 1, kAny, Slot,
   "The slot of each session or group NAME (any string): zlib's CRC-32 of its\n"
   "hashed part mod 256, the hashed part being its hash tag (the characters\n"
   "between the first '{' and the first '}' after it, if any) or else the whole\n"
   "name; a name with a tag also shows it (hashed_part). Sessions are sharded by\n"
   "slot; the slot map says which replica owns each slot, hence the session.\n"
   "HAProxy routes on the same slot, from the routing header, which carries the\n"
   "hashed part: req.hdr(x-qparams-session),crc32,mod(256). Computed here: calls\n"
   "no server."},
  {"reshard",
   "LOW:HIGH SOURCE TARGET [--resume|--abort] [--stop_before_switch] "
   "[--replica_addresses=R=ADDR,...] [--haproxy_admin=SOCKET,...] [--haproxy_map=NAME]",
   3, 3, Reshard,
   "Move slots LOW:HIGH from replica SOURCE to replica TARGET online\n"
   "(docs/sharding.md, Moving slots online): TARGET imports them, SOURCE freezes\n"
   "their writes (UNAVAILABLE, retry), their sessions and groups are copied, the\n"
   "new slot map (epoch + 1) goes to TARGET, SOURCE and the other replicas\n"
   "(SetSlotMap), then each --haproxy_admin HAProxy (its runtime API), then both\n"
   "clear their states and SOURCE drops its copies.\n"
   "--stop_before_switch stops after the copy (outcome awaiting_switch, with\n"
   "next_map) for the operator to put the map in force; --resume continues a move,\n"
   "--abort rolls it back before its switch. Steps are printed on stderr. Needs an\n"
   "admin token of the replicas' --admin_tokens_file."},
  {"slotmap", "SUBCOMMAND [ARGS]", 0, 0, nullptr,
   "Slot maps of a sharded deployment (docs/sharding.md, \"Changing the topology\").\n"
   "Subcommands:",
   kSlotMapCommands, sizeof(kSlotMapCommands) / sizeof(kSlotMapCommands[0])},
  {"group", "SUBCOMMAND [ARGS]", 0, 0, nullptr,
   "Scale groups: named lists of sessions that share their scales\n"
   "(docs/scale_groups.md). A group routes by its name as a session does; sharded,\n"
   "name a group and its members with one hash tag ({layer0}.qkv). Subcommands:",
   kGroupCommands, sizeof(kGroupCommands) / sizeof(kGroupCommands[0])},
};
// clang-format on

// `parent` is the command of a subcommand, or null.
std::string Synopsis(const Command& command, const Command* parent = nullptr) {
  return absl::StrCat("qparams-cli [flags] ", parent != nullptr ? parent->name : "",
                      parent != nullptr ? " " : "", command.name,
                      command.args.empty() ? "" : absl::StrCat(" ", command.args));
}

// "static, moving_average, ... or mse": the registry's session calculators (those
// with a stateful factory), sorted by key.
std::string SessionCalculators() {
  std::vector<std::string> keys;
  for (const CalculatorClass* c : QParamsCalculatorRegistry::Global().ListRegistryValues()) {
    if (c->create_stateful != nullptr) keys.push_back(c->key);
  }
  if (keys.size() < 2) return absl::StrJoin(keys, "");
  const std::string last = keys.back();
  keys.pop_back();
  return absl::StrCat(absl::StrJoin(keys, ", "), " or ", last);
}

// `command`'s help, with the registry's session calculators in place of $CALCULATORS.
std::string Help(const Command& command) {
  return absl::StrReplaceAll(command.help, {{"$CALCULATORS", SessionCalculators()}});
}

const Command* Find(const Command* commands, size_t count, absl::string_view name) {
  for (size_t i = 0; i < count; ++i) {
    if (commands[i].name == name) return &commands[i];
  }
  return nullptr;
}

// "create, get, list, delete or qparams": the names of `command`'s subcommands.
std::string SubcommandNames(const Command& command) {
  std::vector<absl::string_view> names;
  for (size_t i = 0; i < command.subcommand_count; ++i) {
    names.push_back(command.subcommands[i].name);
  }
  const absl::string_view last = names.back();
  names.pop_back();
  return absl::StrCat(absl::StrJoin(names, ", "), " or ", last);
}

}  // namespace

int Usage(std::ostream& err, absl::string_view message) {
  err << "error: INVALID_ARGUMENT: " << message << "\n";
  return kExitUsage;
}

std::string CalculatorFlagHelp() {
  return absl::StrCat(
      "compute: \"\" (= dynamic), dynamic or static. create: \"\" (= default: static for "
      "weights, moving_average for activations), ",
      SessionCalculators());
}

std::string UsageMessage() {
  std::string usage =
      "Computes quantization parameters (scale, zero point, minval) on a qparams server.\n"
      "\n"
      "Usage: qparams-cli [flags] COMMAND [ARGS]\n"
      "\n"
      "Commands:\n";
  for (const Command& c : kCommands) {
    absl::StrAppend(&usage, "  ", c.name, c.args.empty() ? "" : " ", c.args, "\n      ",
                    absl::StrReplaceAll(Help(c), {{"\n", "\n      "}}), "\n");
    for (size_t i = 0; i < c.subcommand_count; ++i) {
      const Command& sub = c.subcommands[i];
      absl::StrAppend(&usage, "      ", c.name, " ", sub.name, sub.args.empty() ? "" : " ",
                      sub.args, "\n          ",
                      absl::StrReplaceAll(Help(sub), {{"\n", "\n          "}}), "\n");
    }
  }
  absl::StrAppend(
      &usage,
      "\n"
      "Every command takes --target, --format, --timeout, --retry_total and the\n"
      "connection flags.\n"
      "\n"
      "Connection: --tls connects over TLS and verifies the server against the\n"
      "system's root certificates; --tls_ca=FILE against the PEM roots in FILE\n"
      "instead. --tls_cert=FILE and --tls_key=FILE (both or neither) present a client\n"
      "certificate to a server that requires one (mutual TLS). Any of these three\n"
      "implies TLS. --tls_server_name=NAME checks the server's certificate for NAME\n"
      "instead of --target's host (e.g. localhost with --target=127.0.0.1:50051).\n"
      "--token=TOKEN (default: --token_file=FILE's content, else $QPARAMS_TOKEN) is\n"
      "sent as \"authorization: Bearer TOKEN\" on every call but health; prefer the\n"
      "file or the variable, as other users of the machine can see a command line. --replica=NAME "
      "addresses every call to that\n"
      "replica of a sharded deployment (through the balancer or straight to it)\n"
      "instead of routing each by its session.\n"
      "\n"
      "Spec flags (compute, create): --spec takes a whole QuantSpec in protobuf's JSON\n"
      "mapping, e.g. --spec='{\"dtype\": \"int4\", \"qscheme\": \"ASYMMETRIC\"}'; each of\n"
      "--quant_dtype, --qscheme, --granularity, --quant_target, --quant_min, --quant_max,\n"
      "--float_range_min, --float_range_max, --scale_dtype and --convention then\n"
      "overrides its field.\n"
      "\n"
      "Histogram flags (create, with --calculator=percentile, entropy or mse; unset =\n"
      "the default): --num_bins (a power of two in [256, 65536]; 4096), --percentile\n"
      "(percentile only, 0 < P <= 100; 99.99), --start_bin and --stride (entropy and\n"
      "mse only; 128 and 1), --skip_zeros (leave exact zeros out of the search),\n"
      "--nonfinite=reject|ignore (what NaN and +-Inf do; reject).\n"
      "\n"
      "GRANULARITY (--granularity and the granularity command):\n"
      "  per_tensor | per_channel:AXIS | per_block:AXIS:SIZE | per_block:B0,B1,...\n"
      "  (the last is multi-axis: one block size per dim, -1 = the whole dim).\n"
      "\n"
      ".npy files: float32, float16 or float64, little-endian, C order; bfloat16 as\n"
      "'<u2' or '<i2' bits with --dtype=bfloat16.\n"
      "\n"
      "Output: each response as JSON (protobuf's mapping; observe prints one document\n"
      "per file), or a short table with --format=table. Errors go to stderr as\n"
      "\"error: CODE: message\". Exit status: 0 success, 1 a failed call, file or\n"
      "observation, 2 a usage error. Flag names may use '-' for '_'.");
  return usage;
}

int Run(const std::vector<std::string>& args, const Options& options, std::ostream& out,
        std::ostream& err) {
  if (args.empty()) {
    return Usage(err, "no COMMAND given; run qparams-cli --help for the commands");
  }
  const Command* command = Find(kCommands, sizeof(kCommands) / sizeof(kCommands[0]), args[0]);
  if (command == nullptr) {
    return Usage(err, absl::StrCat("unknown command \"", args[0],
                                   "\"; run qparams-cli --help for the commands"));
  }
  const Command* parent = nullptr;
  size_t first_arg = 1;
  if (command->subcommand_count > 0) {
    const Command* sub =
        args.size() < 2 ? nullptr : Find(command->subcommands, command->subcommand_count, args[1]);
    if (sub == nullptr) {
      return Usage(
          err, absl::StrCat(args.size() < 2 ? "no SUBCOMMAND given"
                                            : absl::StrCat("unknown subcommand \"", args[1], "\""),
                            "; usage: ", Synopsis(*command), ", SUBCOMMAND being ",
                            SubcommandNames(*command), "; run qparams-cli --help for each"));
    }
    parent = command;
    command = sub;
    first_arg = 2;
  }
  std::vector<std::string> command_args(args.begin() + first_arg, args.end());
  if (command_args.size() < command->min_args || command_args.size() > command->max_args) {
    return Usage(err, absl::StrCat("usage: ", Synopsis(*command, parent)));
  }
  // export's --format names the export format instead.
  if (command->run != Export && options.format != "json" && options.format != "table") {
    return Usage(err, absl::StrCat("--format: \"", options.format, "\" is not json or table"));
  }
  if (!options.dtype.empty()) {
    absl::StatusOr<DType> dtype = ParseDType(options.dtype);
    if (!dtype.ok()) return Usage(err, absl::StrCat("--dtype: ", dtype.status().message()));
  }
  if (options.target.empty()) return Usage(err, "--target is empty");
  if (options.timeout <= absl::ZeroDuration()) {
    return Usage(err, absl::StrCat("--timeout must be positive, not ",
                                   absl::FormatDuration(options.timeout)));
  }
  if (options.retry_total < absl::ZeroDuration()) {
    return Usage(err, absl::StrCat("--retry_total must be >= 0, not ",
                                   absl::FormatDuration(options.retry_total)));
  }
  ClientOptions client_options;
  client_options.timeout = options.timeout;
  client_options.retry_total = options.retry_total;
  client_options.bearer_token = options.token;
  client_options.replica = options.replica;
  const bool tls = options.tls || !options.tls_ca.empty() || !options.tls_cert.empty() ||
                   !options.tls_key.empty();
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return Usage(err, "--tls_cert and --tls_key go together: give both or neither");
  }
  if (!tls && !options.tls_server_name.empty()) {
    return Usage(err, "--tls_server_name needs TLS (--tls, --tls_ca, --tls_cert or --tls_key)");
  }
  if (tls) {
    // A file that cannot be read, or holds no certificate or key, fails like a .npy
    // file that cannot be read.
    absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
        TlsCredentials(options.tls_ca, options.tls_cert, options.tls_key);
    if (!credentials.ok()) {
      err << "error: " << absl::StatusCodeToString(credentials.status().code()) << ": "
          << credentials.status().message() << "\n";
      return kExitFailed;
    }
    client_options.credentials = *std::move(credentials);
    client_options.tls_server_name = options.tls_server_name;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options.target, client_options);
  if (!client.ok()) return Usage(err, client.status().message());
  Invocation invocation(std::move(command_args), options, *std::move(client), client_options, out,
                        err);
  return command->run(invocation);
}

}  // namespace qparams::cli
