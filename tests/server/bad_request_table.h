// The table of bad requests that bad_request_test.cc runs: the server state its rows
// are written against (sessions and scale groups in varied states, two tenants), the
// shape of a row, the helpers that build the rows' requests, and one function per
// subsystem returning its rows. Every row names the RPC, the request, the expected
// gRPC code and a substring of the message that names the offending field.
//
// The rows are numbered in the order of the functions below, and each test's name
// carries its row's number: a row added anywhere but at the end of SlotRows()
// renames every test after it.

#ifndef QPARAMS_TESTS_BAD_REQUEST_TABLE_H_
#define QPARAMS_TESTS_BAD_REQUEST_TABLE_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "grpcpp/support/status_code_enum.h"
#include "qparams/v1/qparams.pb.h"

namespace qparams::testing::bad_request {

using grpc::StatusCode;

inline constexpr StatusCode kInvalid = StatusCode::INVALID_ARGUMENT;
inline constexpr StatusCode kPrecondition = StatusCode::FAILED_PRECONDITION;
inline constexpr StatusCode kNotFound = StatusCode::NOT_FOUND;
inline constexpr StatusCode kExists = StatusCode::ALREADY_EXISTS;
inline constexpr StatusCode kExhausted = StatusCode::RESOURCE_EXHAUSTED;

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
// The server of this test takes tensors of up to this many elements, so that a
// well-formed tensor above the limit stays small on the wire.
inline constexpr int64_t kMaxElements = int64_t{1} << 16;

// ---- The server's state before each row ----

// Sessions held by the server before the table, one per state.
inline constexpr char kStatic[] = "hard/static";      // static, uninitialized, per_channel(1)
inline constexpr char kMovingAvg[] = "hard/ma-bf16";  // moving_average per_channel(0), bf16 [2, 3]
inline constexpr char kExport[] = "hard/gmm-export";  // global_minmax, f32 [4], export mode on
inline constexpr char kBlock[] = "hard/block";        // static per_block (-1, 2), f16 [2, 4]
inline constexpr char kHist[] = "hard/hist";          // percentile, 256 bins, [1.0] observed
inline constexpr char kHistFull[] = "hard/hfull";     // mse, 256 bins, 2^62 - 5 values of 1.0
inline constexpr char kHistEmpty[] = "hard/hnew";     // entropy, uninitialized
// NVFP4 weights (global_minmax, per_block (-1, 16), f32 [2, 32]) under "hard/gmm" with
// kExport, which compressed-tensors also takes: fused siblings q_proj and k_proj of
// convention compressed_tensors with different amaxes (no group), one of modelopt.
inline constexpr char kNvfp4CtSiblings[] = "hard/gmm-nvfp4-ct.";
inline constexpr char kNvfp4Ct[] = "hard/gmm-nvfp4-ct.q_proj.weight";
inline constexpr char kNvfp4CtK[] = "hard/gmm-nvfp4-ct.k_proj.weight";
inline constexpr char kNvfp4Mo[] = "hard/gmm-nvfp4-mo.weight";
inline constexpr char kPrefix[] = "hard/";

// The two tenants (authentication is on): every row runs as tenant A unless it says
// otherwise.
inline constexpr char kTokenA[] = "hardening-token-of-a-0123";
inline constexpr char kTokenB[] = "hardening-token-of-b-0123";
inline constexpr char kAdminToken[] = "hardening-admin-token-0123";
// Scale groups (nvfp4.md 4), under their own prefix, out of every export row's: an
// export reads the GLOBAL_AMAX groups of the sessions it exports. Tenant A's
// sessions for them: NVFP4 weights as kNvfp4Ct's spec, q and k observed in f32, v in
// bf16; u.a and u.b static int8 per_tensor, uninitialized, until u.b's granularity
// is set per_channel(0) after its group was created; doomed, deleted after its group
// was created.
inline constexpr char kGrpQ[] = "hgrp/{l0}.q";
inline constexpr char kGrpK[] = "hgrp/{l0}.k";
inline constexpr char kGrpV[] = "hgrp/{l0}.v";
inline constexpr char kGrpUa[] = "hgrp/u.a";
inline constexpr char kGrpUb[] = "hgrp/u.b";
inline constexpr char kGrpDoomed[] = "hgrp/doomed";
// Tenant A's groups: q+k GLOBAL_AMAX; q+v GLOBAL_AMAX (input dtypes differ); u.a+u.b
// UNION_RANGE (specs no longer agree); u.a+doomed UNION_RANGE (a member deleted);
// kHist UNION_RANGE (a member without a range).
inline constexpr char kGroupQk[] = "hgrp/g.qk";
inline constexpr char kGroupDtypes[] = "hgrp/g.dtypes";
inline constexpr char kGroupDrift[] = "hgrp/g.drift";
inline constexpr char kGroupOrphan[] = "hgrp/g.orphan";
inline constexpr char kGroupHist[] = "hgrp/g.hist";
inline constexpr char kGroupPrefix[] = "hgrp/g.";
// Tenant B: a session of kGrpQ's name, one only B has, and a GLOBAL_AMAX group of
// the first.
inline constexpr char kBOnly[] = "hgrp/b-only";
inline constexpr char kGroupB[] = "hgrp/g.b";
// The server holds exactly this many groups, its --max_scale_groups.
inline constexpr int kGroups = 6;

// The page tokens the rows use, issued by the server before the table.
struct Tokens {
  std::string for_all;     // ListSessions(page_size 1, filter "")
  std::string for_prefix;  // ListSessions(page_size 1, filter kPrefix)
  std::string for_groups;  // ListScaleGroups(page_size 1, filter kGroupPrefix)
};

// ---- Request building ----

// A wire tensor of `values` in `dtype` (16-bit formats round with RNE; NaN and
// +-Inf map to the format's NaN and +-Inf).
v1::Tensor T(v1::DType dtype, const std::vector<int64_t>& shape, const std::vector<double>& values);
v1::Tensor F32(const std::vector<int64_t>& shape, const std::vector<double>& values);
v1::Tensor Bf16(const std::vector<int64_t>& shape, const std::vector<double>& values);
v1::Tensor F16(const std::vector<int64_t>& shape, const std::vector<double>& values);
// A tensor with the given fields as they are (no consistency).
v1::Tensor RawTensor(int dtype, const std::vector<int64_t>& shape, std::string data);
// A good f32 [2, 3] tensor, for rows whose error is elsewhere.
v1::Tensor Good();

v1::Granularity PerTensor();
v1::Granularity PerChannel(int32_t axis);
v1::Granularity PerBlockAxis(int32_t axis, std::vector<int64_t> sizes);
v1::Granularity PerBlockMulti(std::vector<int64_t> sizes);

v1::QuantSpec Spec(const std::string& dtype = "int8", v1::QScheme qscheme = v1::SYMMETRIC,
                   const v1::Granularity& granularity = PerTensor(),
                   v1::Target target = v1::WEIGHT);
v1::QuantSpec WithQuantRange(v1::QuantSpec spec, std::optional<double> qmin,
                             std::optional<double> qmax);
v1::QuantSpec WithFloatRange(v1::QuantSpec spec, std::optional<double> min,
                             std::optional<double> max);
v1::QuantSpec WithScaleDType(v1::QuantSpec spec, const std::string& scale_dtype);

v1::ComputeRequest ComputeReq(const std::string& calculator, const v1::QuantSpec& spec,
                              const v1::Tensor& tensor);
v1::CreateSessionRequest CreateReq(const std::string& name, const std::string& calculator,
                                   const v1::QuantSpec& spec,
                                   std::optional<double> averaging_constant = std::nullopt);
// A request of any kind that names one session or group.
template <typename Message>
Message Named(const std::string& name) {
  Message r;
  r.set_name(name);
  return r;
}
v1::ListSessionsRequest ListReq(int32_t page_size, const std::string& token,
                                const std::string& filter);
v1::ObserveRequest ObserveTensorReq(const std::string& name, const v1::Tensor& tensor);
// `r` with the idempotency key (client_id, sequence), as given.
v1::ObserveRequest WithKey(v1::ObserveRequest r, const std::string& client_id, uint64_t sequence);
v1::ObserveRequest ObserveRangeReq(const std::string& name, const std::vector<int64_t>& shape,
                                   const std::optional<v1::Tensor>& min,
                                   const std::optional<v1::Tensor>& max);
// A histogram observation of 256 bins; by default the valid histogram of [1.0]
// (exponent -7, amax in bin 128), for rows that break one rule.
struct HistogramFields {
  int32_t num_bins = 256;
  int32_t exponent = -7;
  std::vector<uint64_t> counts = Counts128(1);
  uint64_t zero_count = 0;
  uint64_t negative_count = 0;
  uint64_t nan_count = 0;
  std::optional<double> min = 1.0;
  std::optional<double> max = 1.0;

  // 129 counts, `last` in bin 128 (the bin of 1.0 at exponent -7).
  static std::vector<uint64_t> Counts128(uint64_t last) {
    std::vector<uint64_t> counts(129, 0);
    counts[128] = last;
    return counts;
  }
};
v1::ObserveRequest ObserveHistReq(const std::string& name, const HistogramFields& f);
// The default histogram of HistogramFields with `edit` applied.
template <typename Edit>
v1::ObserveRequest HistReq(const std::string& name, Edit edit) {
  HistogramFields fields;
  edit(fields);
  return ObserveHistReq(name, fields);
}
v1::CreateSessionRequest CreateHistReq(const std::string& calculator, const v1::QuantSpec& spec,
                                       const v1::HistogramParams& params,
                                       const std::string& name = "hard/new");
template <typename Edit>
v1::HistogramParams Params(Edit edit) {
  v1::HistogramParams params;
  edit(params);
  return params;
}

v1::SetExportModeRequest ExportReq(const std::string& name, bool enabled);
v1::SetGranularityRequest GranularityReq(const std::string& name,
                                         const std::optional<v1::Granularity>& g);
v1::CreateScaleGroupRequest GroupReq(const std::string& name,
                                     const std::vector<std::string>& members, int share,
                                     bool fill_uncalibrated = false);
v1::ListScaleGroupsRequest ListGroupsReq(int32_t page_size, const std::string& token,
                                         const std::string& filter);

// ---- Rows ----

enum class Method {
  kCompute,
  kCreateSession,
  kGetSession,
  kListSessions,
  kReadSessions,
  kExportSessions,
  kDeleteSession,
  kObserve,
  kObserveStream,
  kObserveBatch,
  kGetQParams,
  kGetHistogram,
  kSetExportMode,
  kSetGranularity,
  kCreateScaleGroup,
  kGetScaleGroup,
  kListScaleGroups,
  kDeleteScaleGroup,
  kGetGroupQParams,
  kSetSlotMap,
};

const char* MethodName(Method m);

using Request =
    std::variant<v1::ComputeRequest, v1::CreateSessionRequest, v1::GetSessionRequest,
                 v1::ListSessionsRequest, v1::ReadSessionsRequest, v1::ExportSessionsRequest,
                 v1::DeleteSessionRequest, v1::ObserveRequest, v1::ObserveBatchRequest,
                 v1::GetQParamsRequest, v1::GetHistogramRequest, v1::SetExportModeRequest,
                 v1::SetGranularityRequest, v1::CreateScaleGroupRequest, v1::GetScaleGroupRequest,
                 v1::ListScaleGroupsRequest, v1::DeleteScaleGroupRequest,
                 v1::GetGroupQParamsRequest, v1::SetSlotMapRequest>;

struct Row {
  std::string what;
  Method method;
  Request request;
  StatusCode code;
  std::string field;                                // the message must contain it
  bool as_tenant_b = false;                         // run with kTokenB instead of kTokenA
  bool as_admin = false;                            // run with kAdminToken instead of kTokenA
  std::optional<std::string> token = std::nullopt;  // run with this token instead ("": none)
};

// One subsystem's rows, appended in order; the helpers add the kinds of row that
// several subsystems share, each run as tenant A.
class Table {
 public:
  void Add(Row row);
  void Add(std::string what, Method method, Request request, StatusCode code, std::string field);
  // Compute of `tensor` with `spec` and `calculator`.
  void Compute(std::string what, const v1::Tensor& tensor, StatusCode code, std::string field,
               const v1::QuantSpec& spec = Spec(), const std::string& calculator = "static");
  // CreateSession of `name`.
  void Create(std::string what, const v1::QuantSpec& spec, StatusCode code, std::string field,
              const std::string& calculator = "static",
              std::optional<double> averaging_constant = std::nullopt,
              const std::string& name = "hard/new");
  void Observe(std::string what, v1::ObserveRequest request, StatusCode code, std::string field);
  // A stream item, also sent as a batch of one: both answer it in the item's status.
  void Stream(std::string what, v1::ObserveRequest request, StatusCode code, std::string field);
  // ExportSessions of `prefix` to `format`, named "export <what>".
  void ExportSessions(const std::string& what, const std::string& prefix, const std::string& format,
                      bool allow_uninitialized, StatusCode code, const std::string& field);

  // The row added last, for the fields the helpers leave at their defaults.
  Row& Last() { return rows_.back(); }
  std::vector<Row> TakeRows() { return std::move(rows_); }

 private:
  std::vector<Row> rows_;
};

// ---- The table, in order ----

// Compute (bad_requests_specs.cc): malformed tensors, bad values, granularities
// against the tensor's shape, calculators.
std::vector<Row> TensorRows();
// CreateSession (bad_requests_specs.cc): bad specs, calculators, averaging_constant,
// names.
std::vector<Row> SpecRows();
// GetSession, DeleteSession, GetQParams, SetExportMode, ReadSessions, ExportSessions
// and ListSessions (bad_requests_sessions.cc): names, prefixes, formats, paging.
std::vector<Row> SessionRows(const Tokens& tokens);
// Observe, ObserveStream, ObserveBatch (bad_requests_observations.cc): tensors and
// ranges on sessions in each state, idempotency keys, the batch limit.
std::vector<Row> ObservationRows();
// Histogram sessions (bad_requests_histograms.cc): CreateSession's histogram
// parameters, Compute, Observe and ObserveStream of histograms, GetHistogram.
std::vector<Row> HistogramRows();
// SetGranularity (bad_requests_sessions.cc).
std::vector<Row> GranularityRows();
// NVFP4 (bad_requests_nvfp4.cc): specs on CreateSession and Compute, and exports.
std::vector<Row> Nvfp4Rows();
// CreateScaleGroup, GetScaleGroup, ListScaleGroups, DeleteScaleGroup and
// GetGroupQParams (bad_requests_scale_groups.cc).
std::vector<Row> ScaleGroupRows(const Tokens& tokens);
// ClusterAdmin's SetSlotMap (bad_requests_slots.cc): credentials and bad maps.
std::vector<Row> SlotRows();

}  // namespace qparams::testing::bad_request

#endif  // QPARAMS_TESTS_BAD_REQUEST_TABLE_H_
