// The bad requests of the calls that name sessions or a prefix of them (read, list,
// export, delete, export mode) and of SetGranularity.

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> SessionRows(const Tokens& tokens) {
  Table table;
  const std::string long_name(129, 'a');
  auto list = [&](std::string what, v1::ListSessionsRequest r, StatusCode code, std::string field) {
    table.Add(std::move(what), Method::kListSessions, std::move(r), code, std::move(field));
  };

  // ---- GetSession / DeleteSession / GetQParams / SetExportMode ----
  table.Add("GetSession name with a colon", Method::kGetSession,
            Named<v1::GetSessionRequest>("a:b"), kInvalid, "name");
  table.Add("GetSession name empty", Method::kGetSession, Named<v1::GetSessionRequest>(""),
            kInvalid, "name");
  table.Add("GetSession name with a newline", Method::kGetSession,
            Named<v1::GetSessionRequest>("hard/\nstatic"), kInvalid, "name");
  table.Add("GetSession unknown", Method::kGetSession, Named<v1::GetSessionRequest>("hard/missing"),
            kNotFound, "hard/missing");
  table.Add("GetSession differs in case only", Method::kGetSession,
            Named<v1::GetSessionRequest>("HARD/static"), kNotFound, "HARD/static");
  table.Add("DeleteSession name with unicode", Method::kDeleteSession,
            Named<v1::DeleteSessionRequest>("na\xc3\xafve"), kInvalid, "name");
  table.Add("DeleteSession name 129 characters", Method::kDeleteSession,
            Named<v1::DeleteSessionRequest>(long_name), kInvalid, "name");
  table.Add("DeleteSession unknown", Method::kDeleteSession,
            Named<v1::DeleteSessionRequest>("hard/missing"), kNotFound, "hard/missing");
  table.Add("DeleteSession a prefix of an existing name", Method::kDeleteSession,
            Named<v1::DeleteSessionRequest>("hard/stat"), kNotFound, "hard/stat");
  table.Add("GetQParams name with a tab", Method::kGetQParams,
            Named<v1::GetQParamsRequest>("hard/\tstatic"), kInvalid, "name");
  table.Add("GetQParams unknown", Method::kGetQParams, Named<v1::GetQParamsRequest>("hard/missing"),
            kNotFound, "hard/missing");
  table.Add("SetExportMode name empty", Method::kSetExportMode, ExportReq("", true), kInvalid,
            "name");
  table.Add("SetExportMode unknown", Method::kSetExportMode, ExportReq("hard/missing", true),
            kNotFound, "hard/missing");

  // ---- ListSessions ----
  for (const auto& [what, prefix] : std::vector<std::pair<std::string, std::string>>{
           {"a space", "hard/a b"},
           {"a colon", "hard:"},
           {"a newline", "hard/\n"},
           {"129 characters", std::string(129, 'p')}}) {
    v1::ReadSessionsRequest request;
    request.set_prefix(prefix);
    table.Add(absl::StrCat("prefix with ", what), Method::kReadSessions, request, kInvalid,
              "prefix");
    v1::ExportSessionsRequest export_request;
    export_request.set_prefix(prefix);
    export_request.set_format("onnx");
    table.Add(absl::StrCat("export prefix with ", what), Method::kExportSessions, export_request,
              kInvalid, "prefix");
  }
  table.ExportSessions("format empty", kPrefix, "", false, kInvalid, "format");
  table.ExportSessions("format unknown", kPrefix, "csv", false, kInvalid, "format");
  table.ExportSessions("format in capitals", kPrefix, "ONNX", false, kInvalid, "format");
  table.ExportSessions("with an uninitialized session", kStatic, "onnx", false, kPrecondition,
                       kStatic);
  table.ExportSessions("of no session", "hard/none", "onnx", false, kNotFound, "hard/none");
  table.ExportSessions("of multi-axis blocks over a whole axis to aimet", kBlock, "aimet", true,
                       kInvalid, kBlock);
  table.ExportSessions("of a per-channel activation to compressed-tensors", kMovingAvg,
                       "compressed-tensors", true, kInvalid, kMovingAvg);
  list("negative page_size", ListReq(-1, "", ""), kInvalid, "page_size");
  list("page_size INT32_MIN", ListReq(std::numeric_limits<int32_t>::min(), "", kPrefix), kInvalid,
       "page_size");
  list("garbage page_token", ListReq(0, "not a token!", ""), kInvalid, "page_token");
  list("page_token of filter \"\" used with filter \"hard/\"", ListReq(1, tokens.for_all, kPrefix),
       kInvalid, "page_token");
  list("page_token of filter \"hard/\" used with filter \"\"", ListReq(1, tokens.for_prefix, ""),
       kInvalid, "page_token");
  list("page_token of filter \"hard/\" used with filter \"hard/b\"",
       ListReq(1, tokens.for_prefix, "hard/b"), kInvalid, "page_token");
  list("page_token truncated by 2 characters",
       ListReq(1, tokens.for_prefix.substr(0, tokens.for_prefix.size() - 2), kPrefix), kInvalid,
       "page_token");
  list("page_token truncated to half",
       ListReq(1, tokens.for_prefix.substr(0, tokens.for_prefix.size() / 2), kPrefix), kInvalid,
       "page_token");
  list("page_token of an unknown version",
       ListReq(1, absl::WebSafeBase64Escape("v9\n\nhard/block"), ""), kInvalid, "page_token");
  list("page_token with an extra field",
       ListReq(1, absl::WebSafeBase64Escape("v1\n\nhard/block\nx"), ""), kInvalid, "page_token");
  list("filter with a space", ListReq(0, "", "hard/ x"), kInvalid, "filter");
  list("filter 129 characters", ListReq(0, "", long_name), kInvalid, "filter");
  list("filter with unicode", ListReq(0, "", "\xc3\xbc"), kInvalid, "filter");
  return table.TakeRows();
}

std::vector<Row> GranularityRows() {
  Table table;
  auto granularity = [&](std::string what, v1::SetGranularityRequest r, StatusCode code,
                         std::string field) {
    table.Add(std::move(what), Method::kSetGranularity, std::move(r), code, std::move(field));
  };

  // ---- SetGranularity ----
  granularity("unset", GranularityReq(kStatic, std::nullopt), kInvalid, "granularity");
  granularity("set but no kind", GranularityReq(kStatic, v1::Granularity()), kInvalid,
              "granularity");
  granularity("block_size 0", GranularityReq(kStatic, PerBlockAxis(0, {0})), kInvalid,
              "granularity.per_block.block_size");
  granularity("block_size -2", GranularityReq(kStatic, PerBlockMulti({-2})), kInvalid,
              "granularity.per_block.block_size");
  granularity("axis with two block sizes", GranularityReq(kStatic, PerBlockAxis(0, {2, 4})),
              kInvalid, "granularity.per_block");
  granularity("after init (ma, per_tensor)", GranularityReq(kMovingAvg, PerTensor()), kPrecondition,
              "granularity");
  granularity("after init (block, same granularity)",
              GranularityReq(kBlock, PerBlockMulti({-1, 2})), kPrecondition, "granularity");
  granularity("after init (block, an invalid granularity)",
              GranularityReq(kBlock, PerBlockMulti({0})), kPrecondition, "granularity");
  granularity("after init (export-mode session)", GranularityReq(kExport, PerChannel(0)),
              kPrecondition, "granularity");
  granularity("after init (histogram session, per_tensor)", GranularityReq(kHist, PerTensor()),
              kPrecondition, "granularity");
  granularity("histogram session before init, per_channel",
              GranularityReq(kHistEmpty, PerChannel(0)), kInvalid, "per_tensor");
  granularity("name with a star", GranularityReq("hard/*", PerTensor()), kInvalid, "name");
  granularity("unknown session", GranularityReq("hard/missing", PerTensor()), kNotFound,
              "hard/missing");
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request
