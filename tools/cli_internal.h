// What the families of qparams-cli's commands share: the Invocation each command
// runs with, the usage error, and every command's function, which the command table
// (cli.cc) dispatches to. Each family is one file: the session commands
// (cli_sessions.cc), those that name no session (cli_server.cc), observe
// (cli_observe.cc), export (cli_export.cc), the reports (cli_report.cc), the scale
// groups (cli_groups.cc) and the commands of a sharded deployment's slots
// (cli_cluster.cc).
//
// Internal to the qparams_cli_lib target (tools/README.md): only the CLI's source
// files (cli*.cc) include it.

#ifndef QPARAMS_TOOLS_CLI_INTERNAL_H_
#define QPARAMS_TOOLS_CLI_INTERNAL_H_

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/replica_router.h"
#include "core/dtype.h"
#include "qparams/client.h"
#include "tools/cli.h"
#include "tools/cli_output.h"

namespace qparams::cli {

// One run of a command: its arguments, the flags, a client, and where output goes.
// Thread safety: none; a command uses it one call at a time.
class Invocation {
 public:
  Invocation(std::vector<std::string> args, const Options& options, std::unique_ptr<Client> client,
             ClientOptions client_options, std::ostream& out, std::ostream& err)
      : args_(std::move(args)),
        options_(options),
        client_(std::move(client)),
        client_options_(std::move(client_options)),
        out_(out),
        err_(err) {}

  const std::string& arg(size_t i) const { return args_[i]; }
  size_t arg_count() const { return args_.size(); }
  const Options& options() const { return options_; }
  Client& client() { return *client_; }
  // Another client, of `target`, with this one's options (TLS, token, timeout).
  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target) const {
    return Client::Connect(target, client_options_);
  }
  // The options client() was made with (TLS, token, timeout), for further clients.
  const ClientOptions& client_options() const { return client_options_; }
  std::ostream& out() { return out_; }
  std::ostream& err() { return err_; }
  bool table() const { return options_.format == "table"; }
  // The dtype .npy files are read as (--dtype).
  std::optional<DType> dtype() const {
    if (options_.dtype.empty()) return std::nullopt;
    return *ParseDType(options_.dtype);  // Run checked it
  }

  // Reports a failed call or file; returns the exit status: kExitIncomplete for a
  // merged read that could not read some replicas (after what it printed).
  int Fail(const absl::Status& status) {
    err_ << "error: " << absl::StatusCodeToString(status.code()) << ": " << status.message()
         << "\n";
    return UnreachableReplicas(status).empty() ? kExitFailed : kExitIncomplete;
  }

  // `message` as JSON, or with --format=table as its table (cli_output.h).
  template <typename Message>
  void Print(const Message& message) {
    if (table()) {
      PrintTable(message, out_);
    } else {
      PrintJson(message, out_);
    }
  }

  // kExitOk, or, when `unreachable` names replicas a merged page could not read,
  // their names on stderr and kExitIncomplete.
  int FailIfIncomplete(const google::protobuf::RepeatedPtrField<std::string>& unreachable) {
    if (unreachable.empty()) return kExitOk;
    return Fail(IncompleteError(std::vector<std::string>(unreachable.begin(), unreachable.end())));
  }

  // Prints `result`'s value, or reports its error; returns the exit status.
  template <typename Message>
  int PrintResult(const absl::StatusOr<Message>& result) {
    if (!result.ok()) return Fail(result.status());
    Print(*result);
    return kExitOk;
  }

 private:
  const std::vector<std::string> args_;
  const Options& options_;
  const std::unique_ptr<Client> client_;
  const ClientOptions client_options_;
  std::ostream& out_;
  std::ostream& err_;
};

// Reports a command-line mistake to `err`; returns kExitUsage.
int Usage(std::ostream& err, absl::string_view message);

// The commands. Each runs with the number of arguments its entry in the command
// table allows (cli.cc checked it), prints its result to in.out() and its errors to
// in.err() ("error: CODE_NAME: message"), and returns the exit status (cli.h).

// cli_server.cc: the commands that name no session.
int Calculators(Invocation& in);  // calculators
int Compute(Invocation& in);      // compute FILE.npy
int Health(Invocation& in);       // health [SERVICE]: kExitFailed unless SERVING

// cli_sessions.cc: a session's life, state and results.
int Create(Invocation& in);          // create NAME
int Get(Invocation& in);             // get NAME
int List(Invocation& in);            // list: one page
int Delete(Invocation& in);          // delete NAME
int GetQParams(Invocation& in);      // qparams NAME
int GetHistogram(Invocation& in);    // histogram NAME
int ExportMode(Invocation& in);      // export-mode NAME on|off
int SetGranularity(Invocation& in);  // granularity NAME GRANULARITY

// cli_observe.cc: observe NAME FILE.npy...; kExitFailed if any observation failed.
int Observe(Invocation& in);

// cli_export.cc: export, whose --format names the export format instead of json or
// table (Run does not check it).
int Export(Invocation& in);

// cli_report.cc: reports of the sessions under a prefix, read as they stream in.
int Report(Invocation& in);  // report [--html=FILE]: the coverage report
int Steps(Invocation& in);   // steps [PREFIX]: a training run's step progress

// cli_groups.cc: the group subcommands.
int GroupCreate(Invocation& in);   // group create NAME --members=... --share=...
int GroupGet(Invocation& in);      // group get NAME
int GroupList(Invocation& in);     // group list: every page
int GroupDelete(Invocation& in);   // group delete NAME
int GroupQParams(Invocation& in);  // group qparams NAME

// cli_cluster.cc: slots, slot maps and moving slots (docs/sharding.md).
int Slot(Invocation& in);         // slot NAME...: computed here, no call
int SlotMapPush(Invocation& in);  // slotmap push FILE
int SlotMapShow(Invocation& in);  // slotmap show
int Reshard(Invocation& in);      // reshard LOW:HIGH SOURCE TARGET

}  // namespace qparams::cli

#endif  // QPARAMS_TOOLS_CLI_INTERNAL_H_
