// How qparams-cli prints what the server answers: each response as JSON (protobuf's
// JSON mapping, one field a line) or, with --format=table, as a short table.
//
// Internal to the qparams_cli_lib target (tools/README.md): only the CLI's source
// files (cli*.cc) include it. The functions keep no state, so any thread may call
// them; each writes to the stream it is given and never checks it.

#ifndef QPARAMS_TOOLS_CLI_OUTPUT_H_
#define QPARAMS_TOOLS_CLI_OUTPUT_H_

#include <ostream>
#include <string>
#include <vector>

#include "google/protobuf/message.h"
#include "grpc/health/v1/health.pb.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::cli {

// `message` in protobuf's JSON mapping, one field a line, every primitive field
// printed but the few that only some results fill, left out when empty
// (QParams.scale_e4m3, a merged listing's unreachable_replicas). Ends with "\n".
void PrintJson(const google::protobuf::Message& message, std::ostream& out);

// Rows of cells in aligned columns, the first row being the header.
void PrintColumns(const std::vector<std::vector<std::string>>& rows, std::ostream& out);

// The name of a stream item's status code, "OK" included.
std::string CodeName(const v1::RpcStatus& status);

// The --format=table form of each response a command prints (Invocation::Print).
void PrintTable(const v1::ComputeResponse& response, std::ostream& out);
void PrintTable(const v1::GetQParamsResponse& response, std::ostream& out);
void PrintTable(const v1::ObserveResponse& response, std::ostream& out);
void PrintTable(const v1::HistogramObservation& h, std::ostream& out);
void PrintTable(const v1::Session& session, std::ostream& out);
void PrintTable(const v1::ListSessionsResponse& response, std::ostream& out);
void PrintTable(const v1::ListCalculatorsResponse& response, std::ostream& out);
void PrintTable(const v1::ScaleGroup& group, std::ostream& out);
void PrintTable(const v1::ListScaleGroupsResponse& response, std::ostream& out);
void PrintTable(const v1::GroupQParams& result, std::ostream& out);
void PrintTable(const grpc::health::v1::HealthCheckResponse& response, std::ostream& out);

}  // namespace qparams::cli

#endif  // QPARAMS_TOOLS_CLI_OUTPUT_H_
