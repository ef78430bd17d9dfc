// Hardening: a table of bad requests against an in-process server that holds
// sessions and scale groups in varied states, for two tenants. Every row names the
// RPC, the request, the expected gRPC code and a substring of the message that
// names the offending field; after every row the whole store (ListSessions of every
// session and ListScaleGroups of every group, of both tenants, every field, times
// included) must be byte-for-byte what it was before the table (api.md: "A failed
// call changes nothing").

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>

#include <unistd.h>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/scale_group.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "tests/service_test_util.h"
#include "tests/test_util.h"

namespace qparams::testing {
namespace {

using grpc::StatusCode;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
// The server of this test takes tensors of up to this many elements, so that a
// well-formed tensor above the limit stays small on the wire.
constexpr int64_t kMaxElements = int64_t{1} << 16;

// Sessions held by the server before the table, one per state.
constexpr char kStatic[] = "hard/static";      // static, uninitialized, per_channel(1)
constexpr char kMovingAvg[] = "hard/ma-bf16";  // moving_average per_channel(0), bf16 [2, 3]
constexpr char kExport[] = "hard/gmm-export";  // global_minmax, f32 [4], export mode on
constexpr char kBlock[] = "hard/block";        // static per_block (-1, 2), f16 [2, 4]
constexpr char kHist[] = "hard/hist";          // percentile, 256 bins, [1.0] observed
constexpr char kHistFull[] = "hard/hfull";     // mse, 256 bins, 2^62 - 5 values of 1.0
constexpr char kHistEmpty[] = "hard/hnew";     // entropy, uninitialized
// NVFP4 weights (global_minmax, per_block (-1, 16), f32 [2, 32]) under "hard/gmm" with
// kExport, which compressed-tensors also takes: fused siblings q_proj and k_proj of
// convention compressed_tensors with different amaxes (no group), one of modelopt.
constexpr char kNvfp4CtSiblings[] = "hard/gmm-nvfp4-ct.";
constexpr char kNvfp4Ct[] = "hard/gmm-nvfp4-ct.q_proj.weight";
constexpr char kNvfp4CtK[] = "hard/gmm-nvfp4-ct.k_proj.weight";
constexpr char kNvfp4Mo[] = "hard/gmm-nvfp4-mo.weight";
constexpr char kPrefix[] = "hard/";

// The two tenants (authentication is on): every row runs as kTenantA unless it says
// otherwise.
constexpr char kTokenA[] = "hardening-token-of-a-0123";
constexpr char kTokenB[] = "hardening-token-of-b-0123";
constexpr char kAdminToken[] = "hardening-admin-token-0123";
// Scale groups (nvfp4.md 4), under their own prefix, out of every export row's: an
// export reads the GLOBAL_AMAX groups of the sessions it exports. Tenant A's
// sessions for them: NVFP4 weights as kNvfp4Ct's spec, q and k observed in f32, v in
// bf16; u.a and u.b static int8 per_tensor, uninitialized, until u.b's granularity
// is set per_channel(0) after its group was created; doomed, deleted after its group
// was created.
constexpr char kGrpQ[] = "hgrp/{l0}.q";
constexpr char kGrpK[] = "hgrp/{l0}.k";
constexpr char kGrpV[] = "hgrp/{l0}.v";
constexpr char kGrpUa[] = "hgrp/u.a";
constexpr char kGrpUb[] = "hgrp/u.b";
constexpr char kGrpDoomed[] = "hgrp/doomed";
// Tenant A's groups: q+k GLOBAL_AMAX; q+v GLOBAL_AMAX (input dtypes differ); u.a+u.b
// UNION_RANGE (specs no longer agree); u.a+doomed UNION_RANGE (a member deleted);
// kHist UNION_RANGE (a member without a range).
constexpr char kGroupQk[] = "hgrp/g.qk";
constexpr char kGroupDtypes[] = "hgrp/g.dtypes";
constexpr char kGroupDrift[] = "hgrp/g.drift";
constexpr char kGroupOrphan[] = "hgrp/g.orphan";
constexpr char kGroupHist[] = "hgrp/g.hist";
constexpr char kGroupPrefix[] = "hgrp/g.";
// Tenant B: a session of kGrpQ's name, one only B has, and a GLOBAL_AMAX group of
// the first.
constexpr char kBOnly[] = "hgrp/b-only";
constexpr char kGroupB[] = "hgrp/g.b";
// The server holds exactly this many groups, its --max_scale_groups.
constexpr int kGroups = 6;

// ---- Request building ----

DType CoreDType(v1::DType dtype) { return *wire::DTypeFromProto(dtype, "dtype"); }

// A wire tensor of `values` in `dtype` (16-bit formats round with RNE; NaN and
// +-Inf map to the format's NaN and +-Inf).
v1::Tensor T(v1::DType dtype, const std::vector<int64_t>& shape,
             const std::vector<double>& values) {
  v1::Tensor t;
  t.set_dtype(dtype);
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(Encode(CoreDType(dtype), values));
  return t;
}
v1::Tensor F32(const std::vector<int64_t>& shape, const std::vector<double>& values) {
  return T(v1::FLOAT32, shape, values);
}
v1::Tensor Bf16(const std::vector<int64_t>& shape, const std::vector<double>& values) {
  return T(v1::BFLOAT16, shape, values);
}
v1::Tensor F16(const std::vector<int64_t>& shape, const std::vector<double>& values) {
  return T(v1::FLOAT16, shape, values);
}
// A tensor with the given fields as they are (no consistency).
v1::Tensor RawTensor(int dtype, const std::vector<int64_t>& shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(static_cast<v1::DType>(dtype));
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}
// A good f32 [2, 3] tensor, for rows whose error is elsewhere.
v1::Tensor Good() { return F32({2, 3}, {-1, 0.5, 2, 3, -4, 0.25}); }

v1::Granularity PerTensor() {
  v1::Granularity g;
  g.mutable_per_tensor();
  return g;
}
v1::Granularity PerChannel(int32_t axis) {
  v1::Granularity g;
  g.mutable_per_channel()->set_axis(axis);
  return g;
}
v1::Granularity PerBlockAxis(int32_t axis, std::vector<int64_t> sizes) {
  v1::Granularity g;
  g.mutable_per_block()->set_axis(axis);
  for (int64_t b : sizes) g.mutable_per_block()->add_block_size(b);
  return g;
}
v1::Granularity PerBlockMulti(std::vector<int64_t> sizes) {
  v1::Granularity g;
  g.mutable_per_block();
  for (int64_t b : sizes) g.mutable_per_block()->add_block_size(b);
  return g;
}

v1::QuantSpec Spec(const std::string& dtype = "int8", v1::QScheme qscheme = v1::SYMMETRIC,
                   const v1::Granularity& granularity = PerTensor(),
                   v1::Target target = v1::WEIGHT) {
  v1::QuantSpec spec;
  spec.set_dtype(dtype);
  spec.set_qscheme(qscheme);
  *spec.mutable_granularity() = granularity;
  spec.set_target(target);
  return spec;
}
v1::QuantSpec WithQuantRange(v1::QuantSpec spec, std::optional<double> qmin,
                             std::optional<double> qmax) {
  if (qmin) spec.set_quant_min(*qmin);
  if (qmax) spec.set_quant_max(*qmax);
  return spec;
}
v1::QuantSpec WithFloatRange(v1::QuantSpec spec, std::optional<double> min,
                             std::optional<double> max) {
  if (min) spec.mutable_float_range()->set_min(*min);
  if (max) spec.mutable_float_range()->set_max(*max);
  return spec;
}
v1::QuantSpec WithScaleDType(v1::QuantSpec spec, const std::string& scale_dtype) {
  spec.set_scale_dtype(scale_dtype);
  return spec;
}

v1::ComputeRequest ComputeReq(const std::string& calculator, const v1::QuantSpec& spec,
                              const v1::Tensor& tensor) {
  v1::ComputeRequest r;
  r.set_calculator(calculator);
  *r.mutable_spec() = spec;
  *r.mutable_tensor() = tensor;
  return r;
}
v1::CreateSessionRequest CreateReq(const std::string& name, const std::string& calculator,
                                   const v1::QuantSpec& spec,
                                   std::optional<double> averaging_constant = std::nullopt) {
  v1::CreateSessionRequest r;
  r.set_name(name);
  r.set_calculator(calculator);
  *r.mutable_spec() = spec;
  if (averaging_constant) r.set_averaging_constant(*averaging_constant);
  return r;
}
template <typename Request>
Request Named(const std::string& name) {
  Request r;
  r.set_name(name);
  return r;
}
v1::ListSessionsRequest ListReq(int32_t page_size, const std::string& token,
                                const std::string& filter) {
  v1::ListSessionsRequest r;
  r.set_page_size(page_size);
  r.set_page_token(token);
  r.set_filter(filter);
  return r;
}
v1::ObserveRequest ObserveTensorReq(const std::string& name, const v1::Tensor& tensor) {
  v1::ObserveRequest r;
  r.set_name(name);
  *r.mutable_tensor() = tensor;
  return r;
}
// `r` with the idempotency key (client_id, sequence), as given.
v1::ObserveRequest WithKey(v1::ObserveRequest r, const std::string& client_id, uint64_t sequence) {
  r.set_client_id(client_id);
  r.set_sequence(sequence);
  return r;
}
v1::ObserveRequest ObserveRangeReq(const std::string& name, const std::vector<int64_t>& shape,
                                   const std::optional<v1::Tensor>& min,
                                   const std::optional<v1::Tensor>& max) {
  v1::ObserveRequest r;
  r.set_name(name);
  v1::RangeObservation* range = r.mutable_range();
  for (int64_t d : shape) range->add_input_shape(d);
  if (min) *range->mutable_min() = *min;
  if (max) *range->mutable_max() = *max;
  return r;
}
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
v1::ObserveRequest ObserveHistReq(const std::string& name, const HistogramFields& f) {
  v1::ObserveRequest r;
  r.set_name(name);
  v1::HistogramObservation* h = r.mutable_histogram();
  h->set_num_bins(f.num_bins);
  h->set_exponent(f.exponent);
  for (uint64_t c : f.counts) h->add_counts(c);
  h->set_zero_count(f.zero_count);
  h->set_negative_count(f.negative_count);
  h->set_nan_count(f.nan_count);
  if (f.min) h->set_min(*f.min);
  if (f.max) h->set_max(*f.max);
  return r;
}
template <typename Edit>
v1::ObserveRequest HistReq(const std::string& name, Edit edit) {
  HistogramFields fields;
  edit(fields);
  return ObserveHistReq(name, fields);
}
v1::CreateSessionRequest CreateHistReq(const std::string& calculator, const v1::QuantSpec& spec,
                                       const v1::HistogramParams& params,
                                       const std::string& name = "hard/new") {
  v1::CreateSessionRequest r = CreateReq(name, calculator, spec);
  *r.mutable_histogram() = params;
  return r;
}
template <typename Edit>
v1::HistogramParams Params(Edit edit) {
  v1::HistogramParams params;
  edit(params);
  return params;
}

v1::SetExportModeRequest ExportReq(const std::string& name, bool enabled) {
  v1::SetExportModeRequest r;
  r.set_name(name);
  r.set_enabled(enabled);
  return r;
}
v1::SetGranularityRequest GranularityReq(const std::string& name,
                                         const std::optional<v1::Granularity>& g) {
  v1::SetGranularityRequest r;
  r.set_name(name);
  if (g) *r.mutable_granularity() = *g;
  return r;
}

// ---- The table ----

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

const char* MethodName(Method m) {
  switch (m) {
    case Method::kCompute:
      return "Compute";
    case Method::kCreateSession:
      return "CreateSession";
    case Method::kGetSession:
      return "GetSession";
    case Method::kListSessions:
      return "ListSessions";
    case Method::kReadSessions:
      return "ReadSessions";
    case Method::kExportSessions:
      return "ExportSessions";
    case Method::kDeleteSession:
      return "DeleteSession";
    case Method::kObserve:
      return "Observe";
    case Method::kObserveStream:
      return "ObserveStream";
    case Method::kObserveBatch:
      return "ObserveBatch";
    case Method::kGetQParams:
      return "GetQParams";
    case Method::kGetHistogram:
      return "GetHistogram";
    case Method::kSetExportMode:
      return "SetExportMode";
    case Method::kSetGranularity:
      return "SetGranularity";
    case Method::kCreateScaleGroup:
      return "CreateScaleGroup";
    case Method::kGetScaleGroup:
      return "GetScaleGroup";
    case Method::kListScaleGroups:
      return "ListScaleGroups";
    case Method::kDeleteScaleGroup:
      return "DeleteScaleGroup";
    case Method::kGetGroupQParams:
      return "GetGroupQParams";
    case Method::kSetSlotMap:
      return "SetSlotMap";
  }
  return "?";
}

using Request =
    std::variant<v1::ComputeRequest, v1::CreateSessionRequest, v1::GetSessionRequest,
                 v1::ListSessionsRequest, v1::ReadSessionsRequest, v1::ExportSessionsRequest,
                 v1::DeleteSessionRequest, v1::ObserveRequest, v1::ObserveBatchRequest,
                 v1::GetQParamsRequest, v1::GetHistogramRequest, v1::SetExportModeRequest,
                 v1::SetGranularityRequest, v1::CreateScaleGroupRequest,
                 v1::GetScaleGroupRequest, v1::ListScaleGroupsRequest,
                 v1::DeleteScaleGroupRequest, v1::GetGroupQParamsRequest,
                 v1::SetSlotMapRequest>;

struct Row {
  std::string what;
  Method method;
  Request request;
  StatusCode code;
  std::string field;  // the message must contain it
  bool as_tenant_b = false;  // run with kTokenB instead of kTokenA
  bool as_admin = false;     // run with kAdminToken instead of kTokenA
  std::optional<std::string> token = std::nullopt;  // run with this token instead ("": none)
};

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// The page tokens the rows use, issued by the server before the table.
struct Tokens {
  std::string for_all;     // ListSessions(page_size 1, filter "")
  std::string for_prefix;  // ListSessions(page_size 1, filter kPrefix)
  std::string for_groups;  // ListScaleGroups(page_size 1, filter kGroupPrefix)
};

v1::CreateScaleGroupRequest GroupReq(const std::string& name,
                                     const std::vector<std::string>& members, int share,
                                     bool fill_uncalibrated = false) {
  v1::CreateScaleGroupRequest r;
  v1::ScaleGroup* group = r.mutable_group();
  group->set_name(name);
  for (const std::string& m : members) group->add_members(m);
  group->set_share(static_cast<v1::ScaleGroup::Share>(share));
  group->set_fill_uncalibrated(fill_uncalibrated);
  return r;
}
v1::ListScaleGroupsRequest ListGroupsReq(int32_t page_size, const std::string& token,
                                         const std::string& filter) {
  v1::ListScaleGroupsRequest r;
  r.set_page_size(page_size);
  r.set_page_token(token);
  r.set_filter(filter);
  return r;
}

std::vector<Row> BadRequests(const Tokens& tokens) {
  const StatusCode kInvalid = StatusCode::INVALID_ARGUMENT;
  const StatusCode kPrecondition = StatusCode::FAILED_PRECONDITION;
  const StatusCode kNotFound = StatusCode::NOT_FOUND;
  const StatusCode kExists = StatusCode::ALREADY_EXISTS;
  const StatusCode kExhausted = StatusCode::RESOURCE_EXHAUSTED;
  const std::string long_name(129, 'a');
  std::vector<Row> rows;
  auto add = [&rows](std::string what, Method method, Request request, StatusCode code,
                     std::string field) {
    rows.push_back({std::move(what), method, std::move(request), code, std::move(field)});
  };
  auto compute = [&](std::string what, const v1::Tensor& t, StatusCode code, std::string field,
                     const v1::QuantSpec& spec = Spec(), const std::string& calc = "static") {
    add(std::move(what), Method::kCompute, ComputeReq(calc, spec, t), code, std::move(field));
  };
  auto create = [&](std::string what, const v1::QuantSpec& spec, StatusCode code, std::string field,
                    const std::string& calc = "static", std::optional<double> ac = std::nullopt,
                    const std::string& name = "hard/new") {
    add(std::move(what), Method::kCreateSession, CreateReq(name, calc, spec, ac), code,
        std::move(field));
  };
  auto observe = [&](std::string what, v1::ObserveRequest r, StatusCode code, std::string field) {
    add(std::move(what), Method::kObserve, std::move(r), code, std::move(field));
  };
  // A stream item, also sent as a batch of one: both answer it in the item's status.
  auto stream = [&](std::string what, v1::ObserveRequest r, StatusCode code, std::string field) {
    v1::ObserveBatchRequest batch;
    *batch.add_observations() = r;
    add(what, Method::kObserveStream, std::move(r), code, field);
    add(std::move(what), Method::kObserveBatch, std::move(batch), code, std::move(field));
  };
  auto list = [&](std::string what, v1::ListSessionsRequest r, StatusCode code, std::string field) {
    add(std::move(what), Method::kListSessions, std::move(r), code, std::move(field));
  };
  auto granularity = [&](std::string what, v1::SetGranularityRequest r, StatusCode code,
                         std::string field) {
    add(std::move(what), Method::kSetGranularity, std::move(r), code, std::move(field));
  };

  // ---- Malformed tensors: INVALID_ARGUMENT on every path ----
  compute("tensor dtype unset", RawTensor(v1::DTYPE_UNSPECIFIED, {2}, std::string(8, '\0')),
          kInvalid, "tensor.dtype");
  compute("tensor dtype unknown enum 9", RawTensor(9, {2}, std::string(8, '\0')), kInvalid,
          "tensor.dtype");
  compute("tensor dtype negative enum -1", RawTensor(-1, {2}, std::string(8, '\0')), kInvalid,
          "tensor.dtype");
  compute("rank 0 (no shape)", RawTensor(v1::FLOAT32, {}, std::string(4, '\0')), kInvalid,
          "tensor.shape");
  compute("negative dim", RawTensor(v1::FLOAT32, {2, -3}, std::string(24, '\0')), kInvalid,
          "tensor.shape");
  compute("dims whose product overflows int64 (2^32 * 2^32)",
          RawTensor(v1::FLOAT32, {int64_t{1} << 32, int64_t{1} << 32}, ""), kInvalid,
          "tensor.shape");
  compute("dims whose product overflows int64 (INT64_MAX * 2)",
          RawTensor(v1::FLOAT16, {std::numeric_limits<int64_t>::max(), 2}, ""), kInvalid,
          "tensor.shape");
  compute("f32 data one byte short", RawTensor(v1::FLOAT32, {2, 3}, std::string(23, '\0')),
          kInvalid, "tensor.data");
  compute("f32 data one byte long", RawTensor(v1::FLOAT32, {2, 3}, std::string(25, '\0')), kInvalid,
          "tensor.data");
  compute("f16 shape with f32-sized data (too long)",
          RawTensor(v1::FLOAT16, {2, 3}, std::string(24, '\0')), kInvalid, "tensor.data");
  compute("f64 data empty", RawTensor(v1::FLOAT64, {3}, ""), kInvalid, "tensor.data");
  // A huge shape with the wrong data: the length is the error to fix, not the limit.
  compute("huge valid shape 2^40 elements (no data sent)",
          RawTensor(v1::FLOAT32, {int64_t{1} << 20, int64_t{1} << 20}, ""), kInvalid,
          "tensor.data");
  compute("shape of 2^62 float64 elements: the bytes it needs overflow int64",
          RawTensor(v1::FLOAT64, {int64_t{1} << 31, int64_t{1} << 31}, std::string(8, '\0')),
          kInvalid, "needs more than 2^63");
  compute("well-formed tensor one element above max_tensor_elements",
          RawTensor(v1::FLOAT16, {kMaxElements + 1}, std::string(2 * (kMaxElements + 1), '\0')),
          kExhausted, "tensor.shape");
  compute("zero-size tensor [2, 0] on a computing forward", RawTensor(v1::FLOAT32, {2, 0}, ""),
          kInvalid, "tensor.shape");
  compute("zero-size tensor [0] on a computing forward", RawTensor(v1::BFLOAT16, {0}, ""), kInvalid,
          "tensor.shape");
  // Values (Policy 1).
  compute("NaN in float32", F32({4}, {1, kNaN, 3, 4}), kInvalid, "tensor.data");
  compute("+Inf in float16", F16({2, 2}, {1, 2, 3, kInf}), kInvalid, "tensor.data");
  compute("-Inf in bfloat16", Bf16({3}, {-kInf, 0, 1}), kInvalid, "tensor.data");
  compute("NaN in float16", F16({2}, {kNaN, 1}), kInvalid, "tensor.data");
  compute("-Inf in float64", T(v1::FLOAT64, {2}, {1, -kInf}), kInvalid, "tensor.data");
  compute("NaN with both float_range bounds set (still checked)", F32({2}, {kNaN, 1}), kInvalid,
          "tensor.data", WithFloatRange(Spec(), -1.0, 1.0));
  // Granularity against the tensor's rank and shape.
  compute("per_channel axis 2 on rank 2", Good(), kInvalid, "granularity.per_channel.axis",
          Spec("int8", v1::SYMMETRIC, PerChannel(2)));
  compute("per_channel axis -3 on rank 2", Good(), kInvalid, "granularity.per_channel.axis",
          Spec("int8", v1::SYMMETRIC, PerChannel(-3)));
  compute("per_channel axis INT32_MIN", Good(), kInvalid, "granularity.per_channel.axis",
          Spec("int8", v1::SYMMETRIC, PerChannel(std::numeric_limits<int32_t>::min())), "dynamic");
  compute("per_block axis 2 on rank 2", Good(), kInvalid, "granularity.per_block.axis",
          Spec("int8", v1::SYMMETRIC, PerBlockAxis(2, {1})));
  compute("per_block block_size 2 does not divide dim 1 (3)", Good(), kInvalid,
          "granularity.per_block.block_size", Spec("int8", v1::SYMMETRIC, PerBlockAxis(1, {2})));
  compute("multi-axis block_size of length 1 on rank 2", Good(), kInvalid,
          "granularity.per_block.block_size", Spec("int8", v1::SYMMETRIC, PerBlockMulti({2})));
  compute("multi-axis block_size of length 3 on rank 2", Good(), kInvalid,
          "granularity.per_block.block_size", Spec("int8", v1::SYMMETRIC, PerBlockMulti({1, 1, 1})),
          "dynamic");
  compute("multi-axis block_size (-1, 2) does not divide dim 1 (3)", Good(), kInvalid,
          "granularity.per_block.block_size", Spec("int8", v1::SYMMETRIC, PerBlockMulti({-1, 2})));
  // Calculators.
  compute("unknown calculator", Good(), kInvalid, "minmax_observer", Spec(), "minmax_observer");
  compute("stateful moving_average on Compute", Good(), kInvalid, "CreateSession", Spec(),
          "moving_average");
  compute("stateful global_minmax on Compute", Good(), kInvalid, "CreateSession", Spec(),
          "global_minmax");
  compute("default (stateful) on Compute", Good(), kInvalid, "CreateSession", Spec(), "default");
  {
    v1::ComputeRequest both = ComputeReq("static", Spec(), Good());
    both.mutable_range()->add_input_shape(2);
    add("Compute with both a tensor and a range", Method::kCompute, std::move(both), kInvalid,
        "tensor and range are both set");
    v1::ComputeRequest neither = ComputeReq("static", Spec(), Good());
    neither.clear_tensor();
    add("Compute with neither a tensor nor a range", Method::kCompute, std::move(neither),
        kInvalid, "tensor and range are both unset");
  }
  compute("dynamic with a float_range", Good(), kInvalid, "float_range",
          WithFloatRange(Spec(), -1.0, std::nullopt), "dynamic");
  compute("dynamic (\"\") with SYMMETRIC_WITH_CLIPPING", Good(), kInvalid, "spec.qscheme",
          Spec("int8", v1::SYMMETRIC_WITH_CLIPPING), "");
  compute("Compute with a bad spec dtype", Good(), kInvalid, "spec.dtype", Spec("int16"));

  // ---- Bad specs on CreateSession (and a few on Compute) ----
  create("dtype int9", Spec("int9"), kInvalid, "spec.dtype");
  create("dtype int0", Spec("int0"), kInvalid, "spec.dtype");
  create("dtype uppercase INT8", Spec("INT8"), kInvalid, "spec.dtype");
  create("dtype float8_e4m3fnuz", Spec("float8_e4m3fnuz"), kInvalid, "spec.dtype");
  create("dtype float32 (an input dtype)", Spec("float32"), kInvalid, "spec.dtype");
  create("float8_e4m3fn with ASYMMETRIC", Spec("float8_e4m3fn", v1::ASYMMETRIC), kInvalid,
         "spec.qscheme");
  create("float8_e5m2 with SYMMETRIC_WITH_CLIPPING",
         Spec("float8_e5m2", v1::SYMMETRIC_WITH_CLIPPING), kInvalid, "spec.qscheme");
  create("e8m0 scale with uint8", WithScaleDType(Spec("uint8"), "float8_e8m0fnu"), kInvalid,
         "spec.scale_dtype");
  create("e8m0 scale with int4", WithScaleDType(Spec("int4"), "float8_e8m0"), kInvalid,
         "spec.scale_dtype");
  create("e8m0 scale with int8 ASYMMETRIC",
         WithScaleDType(Spec("int8", v1::ASYMMETRIC), "float8_e8m0fnu"), kInvalid, "spec.qscheme");
  create("unknown scale_dtype", WithScaleDType(Spec(), "float16"), kInvalid, "spec.scale_dtype");
  create("int1 with SYMMETRIC_WITH_CLIPPING (empty range)",
         Spec("int1", v1::SYMMETRIC_WITH_CLIPPING), kInvalid, "spec.qscheme");
  create("float_range.min > 0", WithFloatRange(Spec(), 0.5, std::nullopt), kInvalid,
         "spec.float_range.min");
  create("float_range.max < 0", WithFloatRange(Spec(), std::nullopt, -0.5), kInvalid,
         "spec.float_range.max");
  create("float_range min == max == 0", WithFloatRange(Spec(), 0.0, 0.0), kInvalid,
         "spec.float_range");
  create("float_range.min -Inf", WithFloatRange(Spec(), -kInf, 1.0), kInvalid,
         "spec.float_range.min");
  create("float_range.max NaN", WithFloatRange(Spec(), std::nullopt, kNaN), kInvalid,
         "spec.float_range.max");
  create("quant_min without quant_max", WithQuantRange(Spec(), -10, std::nullopt), kInvalid,
         "quant_max");
  create("quant_max without quant_min", WithQuantRange(Spec(), std::nullopt, 10), kInvalid,
         "quant_min");
  create("quant_min == quant_max", WithQuantRange(Spec(), 5, 5), kInvalid, "quant_min");
  create("quant_min > quant_max", WithQuantRange(Spec(), 10, -10), kInvalid, "quant_min");
  create("non-integral quant_min", WithQuantRange(Spec(), -1.5, 10), kInvalid, "spec.quant_min");
  create("non-integral quant_max", WithQuantRange(Spec(), -10, 10.25), kInvalid, "spec.quant_max");
  create("NaN quant_min", WithQuantRange(Spec(), kNaN, 10), kInvalid, "spec.quant_min");
  create("int8 quant range [-200, 100] outside the dtype", WithQuantRange(Spec(), -200, 100),
         kInvalid, "quant_min");
  create("uint8 quant_max 256 outside the dtype", WithQuantRange(Spec("uint8"), 0, 256), kInvalid,
         "quant_max");
  create("float8 with a non-derived quant range", WithQuantRange(Spec("float8_e4m3fn"), -100, 100),
         kInvalid, "quant_min");
  create("unknown qscheme enum 7", Spec("int8", static_cast<v1::QScheme>(7)), kInvalid,
         "spec.qscheme");
  create("unknown target enum 5",
         Spec("int8", v1::SYMMETRIC, PerTensor(), static_cast<v1::Target>(5)), kInvalid,
         "spec.target");
  {
    v1::QuantSpec spec = Spec();
    spec.set_range_calculator("percentile");
    create("unknown range_calculator", spec, kInvalid, "spec.range_calculator");
  }
  create("per_block block_size 0", Spec("int8", v1::SYMMETRIC, PerBlockAxis(0, {0})), kInvalid,
         "granularity.per_block.block_size");
  create("per_block block_size -2 (multi-axis)",
         Spec("int8", v1::SYMMETRIC, PerBlockMulti({4, -2})), kInvalid,
         "granularity.per_block.block_size");
  create("per_block with axis and two block sizes",
         Spec("int8", v1::SYMMETRIC, PerBlockAxis(1, {2, 2})), kInvalid, "granularity.per_block");
  create("per_block with axis and block size -1",
         Spec("int8", v1::SYMMETRIC, PerBlockAxis(1, {-1})), kInvalid, "granularity.per_block");
  // Calculators and averaging_constant.
  create("dynamic on CreateSession", Spec(), kInvalid, "Compute", "dynamic");
  create("unknown calculator", Spec(), kInvalid, "calculator", "minmax_observer");
  create("calculator key is case-sensitive (Static)", Spec(), kInvalid, "calculator", "Static");
  create("averaging_constant on static", Spec(), kInvalid, "averaging_constant", "static", 0.5);
  create("averaging_constant on global_minmax", Spec(), kInvalid, "averaging_constant",
         "global_minmax", 0.01);
  create("averaging_constant on default (WEIGHT resolves to static)", Spec(), kInvalid,
         "averaging_constant", "", 0.01);
  create("averaging_constant 0", Spec(), kInvalid, "averaging_constant", "moving_average", 0.0);
  create("averaging_constant -0.0", Spec(), kInvalid, "averaging_constant", "moving_average", -0.0);
  create("averaging_constant > 1", Spec(), kInvalid, "averaging_constant", "moving_average",
         1.0000001);
  create("averaging_constant NaN", Spec(), kInvalid, "averaging_constant", "moving_average", kNaN);
  create("averaging_constant +Inf", Spec(), kInvalid, "averaging_constant", "moving_average", kInf);
  // Names and existence.
  create("name empty", Spec(), kInvalid, "name", "static", std::nullopt, "");
  create("name 129 characters", Spec(), kInvalid, "name", "static", std::nullopt, long_name);
  create("name with a space", Spec(), kInvalid, "name", "static", std::nullopt, "hard/a b");
  create("name with a colon", Spec(), kInvalid, "name", "static", std::nullopt, "hard:x");
  create("name with unicode", Spec(), kInvalid, "name", "static", std::nullopt, "hard/\xc3\xbc");
  create("name with a NUL byte", Spec(), kInvalid, "name", "static", std::nullopt,
         std::string("hard\0x", 6));
  create("name taken (same calculator)", Spec(), kExists, kStatic, "static", std::nullopt, kStatic);
  create("name taken (another calculator)", Spec(), kExists, kMovingAvg, "global_minmax",
         std::nullopt, kMovingAvg);

  // ---- GetSession / DeleteSession / GetQParams / SetExportMode ----
  add("GetSession name with a colon", Method::kGetSession, Named<v1::GetSessionRequest>("a:b"),
      kInvalid, "name");
  add("GetSession name empty", Method::kGetSession, Named<v1::GetSessionRequest>(""), kInvalid,
      "name");
  add("GetSession name with a newline", Method::kGetSession,
      Named<v1::GetSessionRequest>("hard/\nstatic"), kInvalid, "name");
  add("GetSession unknown", Method::kGetSession, Named<v1::GetSessionRequest>("hard/missing"),
      kNotFound, "hard/missing");
  add("GetSession differs in case only", Method::kGetSession,
      Named<v1::GetSessionRequest>("HARD/static"), kNotFound, "HARD/static");
  add("DeleteSession name with unicode", Method::kDeleteSession,
      Named<v1::DeleteSessionRequest>("na\xc3\xafve"), kInvalid, "name");
  add("DeleteSession name 129 characters", Method::kDeleteSession,
      Named<v1::DeleteSessionRequest>(long_name), kInvalid, "name");
  add("DeleteSession unknown", Method::kDeleteSession,
      Named<v1::DeleteSessionRequest>("hard/missing"), kNotFound, "hard/missing");
  add("DeleteSession a prefix of an existing name", Method::kDeleteSession,
      Named<v1::DeleteSessionRequest>("hard/stat"), kNotFound, "hard/stat");
  add("GetQParams name with a tab", Method::kGetQParams,
      Named<v1::GetQParamsRequest>("hard/\tstatic"), kInvalid, "name");
  add("GetQParams unknown", Method::kGetQParams, Named<v1::GetQParamsRequest>("hard/missing"),
      kNotFound, "hard/missing");
  add("SetExportMode name empty", Method::kSetExportMode, ExportReq("", true), kInvalid, "name");
  add("SetExportMode unknown", Method::kSetExportMode, ExportReq("hard/missing", true), kNotFound,
      "hard/missing");

  // ---- ListSessions ----
  for (const auto& [what, prefix] : std::vector<std::pair<std::string, std::string>>{
           {"a space", "hard/a b"},
           {"a colon", "hard:"},
           {"a newline", "hard/\n"},
           {"129 characters", std::string(129, 'p')}}) {
    v1::ReadSessionsRequest request;
    request.set_prefix(prefix);
    add(absl::StrCat("prefix with ", what), Method::kReadSessions, request, kInvalid, "prefix");
    v1::ExportSessionsRequest export_request;
    export_request.set_prefix(prefix);
    export_request.set_format("onnx");
    add(absl::StrCat("export prefix with ", what), Method::kExportSessions, export_request,
        kInvalid, "prefix");
  }
  auto export_sessions = [&](const std::string& what, const std::string& prefix,
                             const std::string& format, bool allow_uninitialized, StatusCode code,
                             const std::string& field) {
    v1::ExportSessionsRequest request;
    request.set_prefix(prefix);
    request.set_format(format);
    request.set_allow_uninitialized(allow_uninitialized);
    add(absl::StrCat("export ", what), Method::kExportSessions, request, code, field);
  };
  export_sessions("format empty", kPrefix, "", false, kInvalid, "format");
  export_sessions("format unknown", kPrefix, "csv", false, kInvalid, "format");
  export_sessions("format in capitals", kPrefix, "ONNX", false, kInvalid, "format");
  export_sessions("with an uninitialized session", kStatic, "onnx", false, kPrecondition, kStatic);
  export_sessions("of no session", "hard/none", "onnx", false, kNotFound, "hard/none");
  export_sessions("of multi-axis blocks over a whole axis to aimet", kBlock, "aimet", true,
                  kInvalid, kBlock);
  export_sessions("of a per-channel activation to compressed-tensors", kMovingAvg,
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

  // ---- Observe: names, observation, tensors on the sessions ----
  observe("name with a space", ObserveTensorReq("hard/a b", Good()), kInvalid, "name");
  observe("unknown session", ObserveTensorReq("hard/missing", Good()), kNotFound, "hard/missing");
  observe("observation unset", Named<v1::ObserveRequest>(kMovingAvg), kInvalid, "observation");
  // Idempotency keys (docs/retries.md): refused before the session is looked at.
  const std::string long_id(65, 'k');
  const std::vector<std::tuple<std::string, std::string, uint64_t, std::string>> keys = {
      {"client_id with a space", "a b", 1, "client_id"},
      {"client_id with a slash", "a/b", 1, "client_id"},
      {"client_id of 65 characters", long_id, 1, "client_id"},
      {"client_id without a sequence", "client-1", 0, "sequence must be >= 1"},
      {"sequence without a client_id", "", 5, "without a client_id"}};
  for (const auto& [what, id, sequence, field] : keys) {
    stream(what, WithKey(ObserveTensorReq(kStatic, Good()), id, sequence), kInvalid, field);
    observe(what, WithKey(ObserveTensorReq(kStatic, Good()), id, sequence), kInvalid, field);
  }
  // The uninitialized static session, per_channel(axis=1).
  observe("static: rank-1 tensor for per_channel axis 1",
          ObserveTensorReq(kStatic, F32({3}, {1, 2, 3})), kInvalid, "granularity.per_channel.axis");
  observe("static: NaN in float32 (first forward)",
          ObserveTensorReq(kStatic, F32({2, 2}, {1, 2, kNaN, 4})), kInvalid, "tensor.data");
  observe("static: zero-size [3, 0] (first forward)",
          ObserveTensorReq(kStatic, RawTensor(v1::FLOAT32, {3, 0}, "")), kInvalid, "tensor.shape");
  observe("static: range min f32, max f16 (dtypes differ)",
          ObserveRangeReq(kStatic, {2, 3}, F32({1, 3}, {-1, -1, -1}), F16({1, 3}, {1, 1, 1})),
          kInvalid, "range.max.dtype");
  // The initialized moving_average session: bf16, per_channel(axis=0), N = [2, 1].
  observe("ma: data one byte short",
          ObserveTensorReq(kMovingAvg, RawTensor(v1::BFLOAT16, {2, 3}, std::string(11, '\0'))),
          kInvalid, "tensor.data");
  observe("ma: data two bytes long",
          ObserveTensorReq(kMovingAvg, RawTensor(v1::BFLOAT16, {2, 3}, std::string(14, '\0'))),
          kInvalid, "tensor.data");
  observe("ma: zero-size [0, 3]", ObserveTensorReq(kMovingAvg, RawTensor(v1::BFLOAT16, {0, 3}, "")),
          kInvalid, "tensor.shape");
  observe("ma: NaN in bfloat16", ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {1, 2, 3, 4, 5, kNaN})),
          kInvalid, "tensor.data");
  observe("ma: +Inf in bfloat16", ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {kInf, 2, 3, 4, 5, 6})),
          kInvalid, "tensor.data");
  observe("ma: float32 after bfloat16 (dtype change)", ObserveTensorReq(kMovingAvg, Good()),
          kPrecondition, "dtype");
  observe("ma: float16 after bfloat16 (dtype change)",
          ObserveTensorReq(kMovingAvg, F16({2, 3}, {1, 2, 3, 4, 5, 6})), kPrecondition, "dtype");
  observe("ma: [3, 3] gives N [3, 1] after [2, 1] (block count change)",
          ObserveTensorReq(kMovingAvg, Bf16({3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9})), kPrecondition,
          "shape");
  observe("ma: rank 1 [6] gives N [6] after [2, 1]",
          ObserveTensorReq(kMovingAvg, Bf16({6}, {1, 2, 3, 4, 5, 6})), kPrecondition, "shape");
  observe("ma range: min of the wrong shape [1, 2]",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({1, 2}, {-1, -1}), Bf16({2, 1}, {1, 1})),
          kInvalid, "range.min.shape");
  observe("ma range: max of the wrong shape [2]",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}), Bf16({2}, {1, 1})), kInvalid,
          "range.max.shape");
  observe("ma range: min bf16, max f32 (dtypes differ)",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}), F32({2, 1}, {1, 1})),
          kInvalid, "range.max.dtype");
  observe("ma range: min and max f32 on a bf16 session",
          ObserveRangeReq(kMovingAvg, {2, 3}, F32({2, 1}, {-1, -1}), F32({2, 1}, {1, 1})),
          kPrecondition, "dtype");
  observe("ma range: min > max in block 1",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, 2}), Bf16({2, 1}, {1, 1})),
          kInvalid, "range.min[1]");
  observe("ma range: NaN in min",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {kNaN, -1}), Bf16({2, 1}, {1, 1})),
          kInvalid, "range.min.data");
  observe("ma range: -Inf in max",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, -kInf})),
          kInvalid, "range.max.data");
  observe("ma range: empty input_shape",
          ObserveRangeReq(kMovingAvg, {}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})), kInvalid,
          "range.input_shape");
  observe("ma range: negative input_shape",
          ObserveRangeReq(kMovingAvg, {2, -3}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
          kInvalid, "range.input_shape");
  observe("ma range: zero in input_shape",
          ObserveRangeReq(kMovingAvg, {2, 0}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
          kInvalid, "range.input_shape");
  observe("ma range: input_shape overflows int64",
          ObserveRangeReq(kMovingAvg, {2, std::numeric_limits<int64_t>::max()},
                          Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
          kInvalid, "range.input_shape");
  observe(
      "ma range: input_shape above max_tensor_elements",
      ObserveRangeReq(kMovingAvg, {2, kMaxElements}, Bf16({2, 1}, {-1, -1}), Bf16({2, 1}, {1, 1})),
      kExhausted, "range.input_shape");
  observe("ma range: min unset",
          ObserveRangeReq(kMovingAvg, {2, 3}, std::nullopt, Bf16({2, 1}, {1, 1})), kInvalid,
          "range.min");
  observe("ma range: max data one byte short",
          ObserveRangeReq(kMovingAvg, {2, 3}, Bf16({2, 1}, {-1, -1}),
                          RawTensor(v1::BFLOAT16, {2, 1}, std::string(3, '\0'))),
          kInvalid, "range.max.data");
  observe("ma range: input_shape [4, 3] changes N to [4, 1]",
          ObserveRangeReq(kMovingAvg, {4, 3}, Bf16({4, 1}, {-1, -1, -1, -1}),
                          Bf16({4, 1}, {1, 1, 1, 1})),
          kPrecondition, "shape");
  // The export-mode session: cached forwards, but tensors must be well formed.
  observe("export: tensor dtype unset",
          ObserveTensorReq(kExport, RawTensor(v1::DTYPE_UNSPECIFIED, {4}, std::string(16, '\0'))),
          kInvalid, "tensor.dtype");
  observe("export: negative dim", ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {-4}, "")),
          kInvalid, "tensor.shape");
  observe("export: rank 0", ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {}, "")), kInvalid,
          "tensor.shape");
  observe("export: data too long",
          ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {4}, std::string(20, '\0'))), kInvalid,
          "tensor.data");
  observe("export: well-formed tensor above max_tensor_elements",
          ObserveTensorReq(kExport, RawTensor(v1::FLOAT16, {kMaxElements + 2},
                                              std::string(2 * (kMaxElements + 2), '\0'))),
          kExhausted, "tensor.shape");
  observe("export: range with an empty input_shape",
          ObserveRangeReq(kExport, {}, F32({1}, {-1}), F32({1}, {1})), kInvalid,
          "range.input_shape");
  observe("export: range whose max dtype is unset",
          ObserveRangeReq(kExport, {4}, F32({1}, {-1}),
                          RawTensor(v1::DTYPE_UNSPECIFIED, {1}, std::string(4, '\0'))),
          kInvalid, "range.max.dtype");
  // The per_block session: static, block_size (-1, 2), f16 [2, 4], N = [1, 2].
  observe("block: dim 1 (3) not divisible by block size 2",
          ObserveTensorReq(kBlock, F16({2, 3}, {1, 2, 3, 4, 5, 6})), kInvalid,
          "granularity.per_block.block_size");
  observe("block: rank 1 for a 2-entry block_size",
          ObserveTensorReq(kBlock, F16({4}, {1, 2, 3, 4})), kInvalid,
          "granularity.per_block.block_size");
  observe("block: [2, 8] gives N [1, 4] after [1, 2] (block count change)",
          ObserveTensorReq(kBlock, F16({2, 8}, std::vector<double>(16, 1.0))), kPrecondition,
          "shape");
  observe("block: bfloat16 after float16 (dtype change)",
          ObserveTensorReq(kBlock, Bf16({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})), kPrecondition, "dtype");
  observe("block range: input_shape [2, 5] not divisible",
          ObserveRangeReq(kBlock, {2, 5}, F16({1, 2}, {-1, -1}), F16({1, 2}, {1, 1})), kInvalid,
          "granularity.per_block.block_size");

  // ---- ObserveStream: the per-response status ----
  stream("stream: name empty", ObserveTensorReq("", Good()), kInvalid, "name");
  stream("stream: unknown session", ObserveTensorReq("hard/missing", Good()), kNotFound,
         "hard/missing");
  stream("stream: observation unset", Named<v1::ObserveRequest>(kStatic), kInvalid, "observation");
  stream("stream: -Inf in bfloat16 on the ma session",
         ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {1, 2, 3, -kInf, 5, 6})), kInvalid,
         "tensor.data");
  stream("stream: float32 on the f16 block session",
         ObserveTensorReq(kBlock, F32({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8})), kPrecondition, "dtype");
  stream("stream: short data on the export session",
         ObserveTensorReq(kExport, RawTensor(v1::FLOAT32, {4}, std::string(15, '\0'))), kInvalid,
         "tensor.data");
  stream("stream: range min > max on the static session",
         ObserveRangeReq(kStatic, {2, 3}, F32({1, 3}, {0, 2, 0}), F32({1, 3}, {1, 1, 1})), kInvalid,
         "range.min[1]");

  // ---- ObserveBatch: the call's own status ----
  {
    v1::ObserveBatchRequest batch;
    for (int i = 0; i <= wire::kMaxBatchObservations; ++i) {
      *batch.add_observations() = ObserveTensorReq(kStatic, Good());
    }
    add("batch: one observation over the limit, all of them good", Method::kObserveBatch,
        std::move(batch), kExhausted, "observations");
  }

  // ---- Histogram sessions (histogram.md §3.2, §4, §9) ----
  auto hist_create = [&](std::string what, const std::string& calc, v1::HistogramParams params,
                         std::string field, const v1::QuantSpec& spec = Spec()) {
    add(std::move(what), Method::kCreateSession, CreateHistReq(calc, spec, params), kInvalid,
        std::move(field));
  };
  hist_create("num_bins 3000 (not a power of two)", "percentile",
              Params([](auto& p) { p.set_num_bins(3000); }), "histogram.num_bins");
  hist_create("num_bins 128", "mse", Params([](auto& p) { p.set_num_bins(128); }),
              "histogram.num_bins");
  hist_create("num_bins 131072", "entropy", Params([](auto& p) { p.set_num_bins(131072); }),
              "histogram.num_bins");
  hist_create("percentile 0", "percentile", Params([](auto& p) { p.set_percentile(0); }),
              "histogram.percentile");
  hist_create("percentile above 100", "percentile",
              Params([](auto& p) { p.set_percentile(100.00000000000001); }),
              "histogram.percentile");
  hist_create("percentile NaN", "percentile", Params([](auto& p) { p.set_percentile(kNaN); }),
              "histogram.percentile");
  hist_create("start_bin 0", "entropy", Params([](auto& p) { p.set_start_bin(0); }),
              "histogram.start_bin");
  hist_create("start_bin above num_bins", "mse", Params([](auto& p) {
                p.set_num_bins(256);
                p.set_start_bin(257);
              }),
              "histogram.start_bin");
  hist_create("stride 0", "mse", Params([](auto& p) { p.set_stride(0); }), "histogram.stride");
  hist_create("percentile on entropy", "entropy", Params([](auto& p) { p.set_percentile(99); }),
              "histogram.percentile");
  hist_create("stride on percentile", "percentile", Params([](auto& p) { p.set_stride(2); }),
              "histogram.stride");
  hist_create("nonfinite unknown enum 7", "percentile",
              Params([](auto& p) { p.set_nonfinite(static_cast<v1::NonFinitePolicy>(7)); }),
              "histogram.nonfinite");
  hist_create("histogram (empty) on static", "static", v1::HistogramParams(), "histogram");
  hist_create("histogram on moving_average", "moving_average",
              Params([](auto& p) { p.set_num_bins(256); }), "histogram");
  hist_create("entropy with float8_e4m3fn", "entropy", v1::HistogramParams(), "spec.dtype",
              Spec("float8_e4m3fn"));
  hist_create("mse with float4_e2m1fn_x2", "mse", v1::HistogramParams(), "spec.dtype",
              Spec("float4_e2m1fn_x2"));
  hist_create("percentile per_channel", "percentile", v1::HistogramParams(), "spec.granularity",
              Spec("int8", v1::SYMMETRIC, PerChannel(0)));
  hist_create("mse with a float_range bound", "mse", v1::HistogramParams(), "spec.float_range",
              WithFloatRange(Spec(), -1.0, std::nullopt));
  compute("percentile on Compute", Good(), kInvalid, "CreateSession", Spec(), "percentile");
  compute("entropy on Compute", Good(), kInvalid, "CreateSession", Spec(), "entropy");
  // Histogram observations breaking a rule of §3.2, on the initialized percentile session.
  observe("hist: num_bins 512 (the session's is 256)",
          HistReq(kHist, [](auto& f) { f.num_bins = 512; }), kInvalid, "histogram.num_bins");
  observe("hist: num_bins 0", HistReq(kHist, [](auto& f) { f.num_bins = 0; }), kInvalid,
          "histogram.num_bins");
  observe("hist: 257 counts", HistReq(kHist, [](auto& f) { f.counts.resize(257); }), kInvalid,
          "histogram.counts");
  observe("hist: counts summing past 2^64 (two of 2^63)",
          HistReq(kHist,
                  [](auto& f) {
                    f.counts[0] = uint64_t{1} << 63;
                    f.counts[128] = uint64_t{1} << 63;
                  }),
          kInvalid, "2^62");
  observe("hist: nan_count under nonfinite=reject",
          HistReq(kHist, [](auto& f) { f.nan_count = 1; }), kInvalid, "histogram.nan_count");
  observe("hist: no value at all",
          HistReq(kHist,
                  [](auto& f) {
                    f.counts.clear();
                    f.min.reset();
                    f.max.reset();
                    f.exponent = -126;
                  }),
          kInvalid, "rule 5");
  observe("hist: min without max", HistReq(kHist, [](auto& f) { f.max.reset(); }), kInvalid,
          "histogram.min");
  observe("hist: no extrema but counts",
          HistReq(kHist,
                  [](auto& f) {
                    f.min.reset();
                    f.max.reset();
                  }),
          kInvalid, "rule 7");
  observe("hist: min > max", HistReq(kHist, [](auto& f) { f.min = 1.5; }), kInvalid, "exceeds max");
  observe("hist: max +Inf", HistReq(kHist, [](auto& f) { f.max = kInf; }), kInvalid,
          "histogram.min");
  observe("hist: exponent -8 for amax 1.0", HistReq(kHist, [](auto& f) { f.exponent = -8; }),
          kInvalid, "histogram.exponent");
  observe("hist: the bin of amax empty",
          HistReq(kHist,
                  [](auto& f) {
                    f.counts[128] = 0;
                    f.counts[3] = 1;
                  }),
          kInvalid, "histogram.counts[128]");
  observe("hist: a count after the bin of amax",
          HistReq(kHist, [](auto& f) { f.counts.push_back(1); }), kInvalid,
          "histogram.counts[129]");
  observe("hist: zero_count above counts[0]", HistReq(kHist, [](auto& f) { f.zero_count = 1; }),
          kInvalid, "histogram.zero_count");
  observe("hist: negative_count with min >= 0",
          HistReq(kHist, [](auto& f) { f.negative_count = 1; }), kInvalid,
          "histogram.negative_count");
  observe("hist: min < 0 without negative_count", HistReq(kHist, [](auto& f) { f.min = -0.5; }),
          kInvalid, "histogram.negative_count");
  // Tensors and ranges on a histogram session, histograms on the others.
  observe("hist: NaN in a tensor under nonfinite=reject",
          ObserveTensorReq(kHist, F32({3}, {1, kNaN, 2})), kInvalid, "nonfinite=reject");
  observe("hist: zero-size tensor [0]", ObserveTensorReq(kHist, RawTensor(v1::FLOAT32, {0}, "")),
          kInvalid, "tensor.shape");
  observe("hist: data one byte short",
          ObserveTensorReq(kHist, RawTensor(v1::FLOAT32, {2}, std::string(7, '\0'))), kInvalid,
          "tensor.data");
  observe("hist: float64 value of 2^128",
          ObserveTensorReq(kHist, T(v1::FLOAT64, {2}, {1, 0x1p128})), kInvalid, "2^128");
  observe("hist: a range observation", ObserveRangeReq(kHist, {2}, F32({1}, {-1}), F32({1}, {1})),
          kInvalid, "RangeObservation");
  observe("static: a histogram observation", ObserveHistReq(kStatic, {}), kInvalid,
          "HistogramObservation");
  observe("ma: a histogram observation", ObserveHistReq(kMovingAvg, {}), kInvalid,
          "HistogramObservation");
  // The 2^62 limit (§5.4): valid observations that the session cannot take.
  observe("full: a histogram of 5 more values",
          HistReq(kHistFull, [](auto& f) { f.counts[128] = 5; }), kExhausted, "2^62");
  observe("full: a tensor of 6 more values",
          ObserveTensorReq(kHistFull, F32({6}, {1, 1, 1, 1, 1, 1})), kExhausted, "2^62");
  stream("stream: histogram of 512 bins on the hist session",
         HistReq(kHist, [](auto& f) { f.num_bins = 512; }), kInvalid, "histogram.num_bins");
  stream("stream: histogram on the static session", ObserveHistReq(kStatic, {}), kInvalid,
         "HistogramObservation");
  stream("stream: 5 more values at the limit",
         HistReq(kHistFull, [](auto& f) { f.counts[128] = 5; }), kExhausted, "2^62");
  add("GetHistogram of a static session", Method::kGetHistogram,
      Named<v1::GetHistogramRequest>(kStatic), kInvalid, "percentile, entropy and mse");
  add("GetHistogram of a moving_average session", Method::kGetHistogram,
      Named<v1::GetHistogramRequest>(kMovingAvg), kInvalid, "moving_average");
  add("GetHistogram name with a space", Method::kGetHistogram,
      Named<v1::GetHistogramRequest>("hard/a b"), kInvalid, "name");
  add("GetHistogram unknown", Method::kGetHistogram, Named<v1::GetHistogramRequest>("hard/missing"),
      kNotFound, "hard/missing");

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

  // ---- NVFP4 specs on CreateSession and Compute (nvfp4.md §2), last so that the rows
  // before keep their numbers: float8_e4m3fn scales need float4_e2m1fn_x2 and
  // per_block; a convention needs them and is spelled exactly; the FP rules stay ----
  {
    const v1::Granularity block16 = PerBlockAxis(-1, {16});
    auto nvfp4 = [&](const std::string& dtype, const v1::Granularity& g,
                     const std::string& convention = "", v1::QScheme qscheme = v1::SYMMETRIC) {
      v1::QuantSpec spec = WithScaleDType(Spec(dtype, qscheme, g), "float8_e4m3fn");
      spec.set_convention(convention);
      return spec;
    };
    auto with_convention = [](v1::QuantSpec spec, const std::string& convention) {
      spec.set_convention(convention);
      return spec;
    };
    create("e4m3 scales with int8", nvfp4("int8", block16), kInvalid, "spec.scale_dtype");
    create("e4m3 scales with float8_e4m3fn", nvfp4("float8_e4m3fn", block16), kInvalid,
           "spec.scale_dtype");
    create("e4m3 scales per_tensor", nvfp4("float4_e2m1fn_x2", PerTensor()), kInvalid,
           "spec.granularity");
    create("e4m3 scales per_channel", nvfp4("float4_e2m1fn_x2", PerChannel(0)), kInvalid,
           "spec.granularity");
    create("convention without a scale_dtype (e8m0)",
           with_convention(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, block16), "modelopt"), kInvalid,
           "spec.convention");
    create("convention with e8m0 scales",
           with_convention(
               WithScaleDType(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, block16), "float8_e8m0fnu"),
               "compressed_tensors"),
           kInvalid, "spec.convention");
    create("convention with int8", with_convention(Spec(), "compressed_tensors"), kInvalid,
           "spec.convention");
    for (const char* convention : {"torchao", "COMPRESSED_TENSORS", "ModelOpt", " modelopt"}) {
      create(absl::StrCat("convention \"", convention, "\""),
             nvfp4("float4_e2m1fn_x2", block16, convention), kInvalid, "spec.convention");
    }
    create("e4m3 scales with SYMMETRIC_WITH_CLIPPING",
           nvfp4("float4_e2m1fn_x2", block16, "", v1::SYMMETRIC_WITH_CLIPPING), kInvalid,
           "spec.qscheme");
    create("e4m3 scales with ASYMMETRIC",
           nvfp4("float4_e2m1fn_x2", block16, "modelopt", v1::ASYMMETRIC), kInvalid,
           "spec.qscheme");
    const v1::Tensor row = F32({1, 16}, std::vector<double>(16, 0.5));
    compute("Compute: e4m3 scales per_tensor", row, kInvalid, "spec.granularity",
            nvfp4("float4_e2m1fn_x2", PerTensor()), "dynamic");
    compute("Compute: e4m3 scales with int4", row, kInvalid, "spec.scale_dtype",
            nvfp4("int4", block16), "dynamic");
    compute("Compute: convention \"torchao\"", row, kInvalid, "spec.convention",
            nvfp4("float4_e2m1fn_x2", block16, "torchao"), "static");
    compute("Compute: convention without e4m3 scales", row, kInvalid, "spec.convention",
            with_convention(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, block16), "modelopt"),
            "dynamic");
    compute("Compute: dynamic e4m3 scales with a float_range", row, kInvalid, "float_range",
            WithFloatRange(nvfp4("float4_e2m1fn_x2", block16), -1.0, 1.0), "dynamic");
  }

  // ---- NVFP4 exports (docs/exports.md): each checkpoint form takes its own
  // convention only, and modelopt NVFP4 sessions only ----
  export_sessions("of a modelopt NVFP4 session to compressed-tensors", kNvfp4Mo,
                  "compressed-tensors", false, kInvalid, "--format=modelopt");
  export_sessions("of a compressed_tensors NVFP4 session to modelopt", kNvfp4Ct, "modelopt",
                  false, kInvalid, "--format=compressed-tensors");
  export_sessions("of an int4 session to modelopt", kExport, "modelopt", false, kInvalid,
                  kExport);
  export_sessions("of an NVFP4 session to onnx", kNvfp4Ct, "onnx", false, kInvalid, kNvfp4Ct);
  export_sessions("of NVFP4 and int sessions together to compressed-tensors", "hard/gmm",
                  "compressed-tensors", false, kInvalid, "separate prefixes");
  export_sessions("of fused siblings with different global scales and no group",
                  kNvfp4CtSiblings, "compressed-tensors", false, kPrecondition, "GLOBAL_AMAX");

  // ---- Scale groups (nvfp4.md 4.1, 4.2; docs/scale_groups.md) ----
  {
    const int kGlobalAmax = v1::ScaleGroup::GLOBAL_AMAX;
    const int kUnionRange = v1::ScaleGroup::UNION_RANGE;
    auto group = [&](std::string what, v1::CreateScaleGroupRequest r, StatusCode code,
                     std::string field) {
      add(std::move(what), Method::kCreateScaleGroup, std::move(r), code, std::move(field));
    };
    const std::vector<std::string> qk = {kGrpQ, kGrpK};
    // 4.1, in the order of its table.
    group("an existing name", GroupReq(kGroupQk, qk, kGlobalAmax), kExists, kGroupQk);
    group("an existing name with other members and share", GroupReq(kGroupQk, {kGrpUa}, kUnionRange),
          kExists, kGroupQk);
    for (const auto& [what, name] : std::vector<std::pair<std::string, std::string>>{
             {"empty", ""},
             {"of 129 characters", long_name},
             {"with a space", "hgrp/g x"},
             {"with a colon", "hgrp:g"},
             {"with a newline", "hgrp/g\n"},
             {"with a NUL byte", std::string("hgrp/g\0x", 8)},
             {"with a non-ASCII byte", "hgrp/g\xc3\xa9"},
             {"with a bracket", "hgrp/g[0]"}}) {
      group(absl::StrCat("name ", what), GroupReq(name, qk, kGlobalAmax), kInvalid, "group.name");
      add(absl::StrCat("name ", what), Method::kGetScaleGroup,
          Named<v1::GetScaleGroupRequest>(name), kInvalid, "name");
      add(absl::StrCat("name ", what), Method::kDeleteScaleGroup,
          Named<v1::DeleteScaleGroupRequest>(name), kInvalid, "name");
      add(absl::StrCat("name ", what), Method::kGetGroupQParams,
          Named<v1::GetGroupQParamsRequest>(name), kInvalid, "name");
      if (!name.empty()) {
        group(absl::StrCat("member ", what), GroupReq("hgrp/g.new", {kGrpQ, name}, kGlobalAmax),
              kInvalid, "group.members[1]");
        add(absl::StrCat("filter ", what), Method::kListScaleGroups, ListGroupsReq(0, "", name),
            kInvalid, "filter");
      }
    }
    group("member empty", GroupReq("hgrp/g.new", {kGrpQ, ""}, kGlobalAmax), kInvalid,
          "group.members[1]");
    group("members empty", GroupReq("hgrp/g.new", {}, kGlobalAmax), kInvalid, "group.members");
    group("a duplicated member", GroupReq("hgrp/g.new", {kGrpQ, kGrpK, kGrpQ}, kGlobalAmax),
          kInvalid, absl::StrCat("\"", kGrpQ, "\" twice"));
    group("one member twice and nothing else", GroupReq("hgrp/g.new", {kGrpUa, kGrpUa}, kUnionRange),
          kInvalid, "twice");
    {
      std::vector<std::string> many;
      for (int i = 0; i <= kMaxGroupMembers; ++i) many.push_back(absl::StrCat("hgrp/m", i));
      group("1025 members (kMaxGroupMembers + 1)", GroupReq("hgrp/g.new", many, kGlobalAmax),
            kInvalid, "group.members has 1025");
      // 1024 pass the count; the first of them then does not exist.
      many.pop_back();
      group("1024 members that do not exist", GroupReq("hgrp/g.new", many, kGlobalAmax), kNotFound,
            "group.members[0]");
    }
    group("share unset", GroupReq("hgrp/g.new", qk, v1::ScaleGroup::SHARE_UNSPECIFIED), kInvalid,
          "group.share");
    group("share an unknown enum value 7", GroupReq("hgrp/g.new", qk, 7), kInvalid, "group.share");
    group("share a negative enum value", GroupReq("hgrp/g.new", qk, -1), kInvalid, "group.share");
    group("a member that does not exist", GroupReq("hgrp/g.new", {kGrpQ, "hgrp/none"}, kGlobalAmax),
          kNotFound, "group.members[1]: session \"hgrp/none\" does not exist");
    group("a member deleted before (doomed)", GroupReq("hgrp/g.new", {kGrpUa, kGrpDoomed}, kUnionRange),
          kNotFound, kGrpDoomed);
    group("a member only tenant B has", GroupReq("hgrp/g.new", {kGrpQ, kBOnly}, kGlobalAmax),
          kNotFound, kBOnly);
    {
      Row row{"tenant B naming tenant A's session", Method::kCreateScaleGroup,
              GroupReq("hgrp/g.new", {kGrpQ, kGrpK}, kGlobalAmax), kNotFound, kGrpK, true};
      rows.push_back(std::move(row));
    }
    group("specs differ in granularity only (u.a per_tensor, u.b now per_channel)",
          GroupReq("hgrp/g.new", {kGrpUa, kGrpUb}, kUnionRange), kInvalid,
          "granularity per_tensor vs per_channel(axis=0)");
    group("specs differ in convention only", GroupReq("hgrp/g.new", {kGrpQ, kNvfp4Mo}, kGlobalAmax),
          kInvalid, "convention compressed_tensors vs modelopt");
    group("specs differ in dtype", GroupReq("hgrp/g.new", {kGrpUa, kExport}, kUnionRange), kInvalid,
          "dtype int8 vs int4");
    group("specs differ in dtype and the rest", GroupReq("hgrp/g.new", {kGrpUa, kMovingAvg}, kUnionRange),
          kInvalid, "dtype int8 vs uint8");
    group("GLOBAL_AMAX on an int8 spec", GroupReq("hgrp/g.new", {kGrpUa}, kGlobalAmax), kInvalid,
          "scale_dtype float8_e4m3fn");
    group("GLOBAL_AMAX on an int4 spec", GroupReq("hgrp/g.new", {kExport}, kGlobalAmax), kInvalid,
          "GLOBAL_AMAX");
    group("UNION_RANGE on a float8_e4m3fn spec", GroupReq("hgrp/g.new", qk, kUnionRange), kInvalid,
          "scale_dtype float8_e4m3fn");
    group("UNION_RANGE on per_channel", GroupReq("hgrp/g.new", {kStatic}, kUnionRange), kInvalid,
          "granularity per_channel(axis=1)");
    group("UNION_RANGE on per_block", GroupReq("hgrp/g.new", {kBlock}, kUnionRange), kInvalid,
          "UNION_RANGE");
    group("a valid group beyond --max_scale_groups", GroupReq("hgrp/g.new", qk, kGlobalAmax),
          kExhausted, "--max_scale_groups");

    // Get / Delete / GetGroupQParams of groups that do not exist, for the caller.
    for (Method method : {Method::kGetScaleGroup, Method::kDeleteScaleGroup, Method::kGetGroupQParams}) {
      auto named = [method](const std::string& name) -> Request {
        switch (method) {
          case Method::kGetScaleGroup:
            return Named<v1::GetScaleGroupRequest>(name);
          case Method::kDeleteScaleGroup:
            return Named<v1::DeleteScaleGroupRequest>(name);
          default:
            return Named<v1::GetGroupQParamsRequest>(name);
        }
      };
      add("unknown group", method, named("hgrp/g.none"), kNotFound, "hgrp/g.none");
      add("a session's name, not a group's", method, named(kStatic), kNotFound, kStatic);
      add("tenant B's group", method, named(kGroupB), kNotFound, kGroupB);
      rows.push_back({"tenant A's group, as tenant B", method, named(kGroupQk), kNotFound, kGroupQk,
                      true});
      add("a group name differing in case", method, named("hgrp/G.qk"), kNotFound, "hgrp/G.qk");
    }
    // 4.2, steps 2 and 4.
    add("a member deleted under the group", Method::kGetGroupQParams,
        Named<v1::GetGroupQParamsRequest>(kGroupOrphan), kPrecondition,
        absl::StrCat("member \"", kGrpDoomed, "\""));
    add("a member whose granularity changed since", Method::kGetGroupQParams,
        Named<v1::GetGroupQParamsRequest>(kGroupDrift), kPrecondition,
        absl::StrCat("member \"", kGrpUb, "\""));
    add("members' input dtypes differ (f32, bf16)", Method::kGetGroupQParams,
        Named<v1::GetGroupQParamsRequest>(kGroupDtypes), kPrecondition, "input dtypes differ");
    add("a calibrated histogram member keeps no range", Method::kGetGroupQParams,
        Named<v1::GetGroupQParamsRequest>(kGroupHist), kPrecondition,
        absl::StrCat("member \"", kHist, "\""));

    // ListScaleGroups: paging as ListSessions.
    auto list_groups = [&](std::string what, v1::ListScaleGroupsRequest r, std::string field) {
      add(std::move(what), Method::kListScaleGroups, std::move(r), kInvalid, std::move(field));
    };
    list_groups("negative page_size", ListGroupsReq(-1, "", ""), "page_size");
    list_groups("page_size INT32_MIN",
                ListGroupsReq(std::numeric_limits<int32_t>::min(), "", kGroupPrefix), "page_size");
    list_groups("a garbage page token", ListGroupsReq(0, "garbage", ""), "page_token");
    list_groups("a page token that is not base64", ListGroupsReq(0, "%%%", ""), "page_token");
    list_groups("a page token cut short",
                ListGroupsReq(0, tokens.for_groups.substr(0, tokens.for_groups.size() / 2),
                              kGroupPrefix),
                "page_token");
    list_groups("a group page token with another filter", ListGroupsReq(1, tokens.for_groups, ""),
                "page_token was issued for filter");
    list_groups("a group page token with a longer filter",
                ListGroupsReq(1, tokens.for_groups, "hgrp/g.q"), "page_token was issued for filter");
    list_groups("a session page token of another filter", ListGroupsReq(1, tokens.for_prefix, ""),
                "page_token was issued for filter");
    list_groups("filter of 129 characters", ListGroupsReq(0, "", long_name), "filter");
  }
  {
    // The admin call: no token or an unknown one is UNAUTHENTICATED, a tenant's
    // token PERMISSION_DENIED (it is no admin's); an admin's bad map is refused naming
    // the line, and a good one on this server without sharding too.
    auto set_map = [&](std::string what, const std::string& map, StatusCode code,
                       std::string field, bool as_admin = true) {
      v1::SetSlotMapRequest r;
      r.set_map(map);
      add(std::move(what), Method::kSetSlotMap, std::move(r), code, std::move(field));
      rows.back().as_admin = as_admin;
    };
    set_map("a tenant's token", "0:255 r0\n", StatusCode::PERMISSION_DENIED,
            "--admin_tokens_file", /*as_admin=*/false);
    set_map("an epoch that is no integer", "0:255 r0\n# epoch x\n", kInvalid,
            "map: slot map line 2");
    set_map("a negative epoch", "# epoch -3\n0:255 r0\n", kInvalid, "non-negative integer");
    set_map("a map missing slot 255", "0:254 r0\n", kInvalid, "no line gives slot 255");
    set_map("a slot given twice", "0:255 r0\n7 r1\n", kInvalid, "slot 7 is already r0's");
    set_map("a replica name with a slash", "0:255 r/0\n", kInvalid, "line 1");
    set_map("a valid map on a server without sharding", "# epoch 1\n0:255 r0\n", kPrecondition,
            "not a replica");
    set_map("no authorization metadata", "0:255 r0\n", StatusCode::UNAUTHENTICATED,
            "--admin_tokens_file");
    rows.back().token = "";
    set_map("a token of neither file", "0:255 r0\n", StatusCode::UNAUTHENTICATED,
            "--admin_tokens_file");
    rows.back().token = "hardening-unknown-token-0123";
  }
  return rows;
}

// ---- The test ----

// One test per row of the table (the parameter is the row's index), each on a fresh
// server holding the same sessions and groups in varied states, for two tenants.
class Hardening : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    tokens_file_ = absl::StrCat(::testing::TempDir(), "/hardening-tokens-", getpid());
    {
      std::FILE* file = std::fopen(tokens_file_.c_str(), "w");
      ASSERT_NE(file, nullptr);
      std::fprintf(file, "%s a\n%s b\n", kTokenA, kTokenB);
      std::fclose(file);
    }
    ServerOptions options;
    options.service.max_tensor_elements = kMaxElements;
    options.engine.max_scale_groups = kGroups;
    options.auth_tokens_file = tokens_file_;
    admin_tokens_file_ = absl::StrCat(tokens_file_, "-admin");
    {
      std::FILE* file = std::fopen(admin_tokens_file_.c_str(), "w");
      ASSERT_NE(file, nullptr);
      std::fprintf(file, "%s ops\n", kAdminToken);
      std::fclose(file);
    }
    options.admin_tokens_file = admin_tokens_file_;
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
    admin_stub_ = server_->NewAdminStub();
    Create(CreateReq(kStatic, "static", Spec("int8", v1::ASYMMETRIC, PerChannel(1))));
    Create(CreateReq(kMovingAvg, "moving_average",
                     Spec("uint8", v1::ASYMMETRIC, PerChannel(0), v1::ACTIVATION), 0.25));
    Observe(ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {-1, 0.5, 2, 3, -4, 0.25})));
    Create(CreateReq(kExport, "global_minmax", Spec("int4")));
    Observe(ObserveTensorReq(kExport, F32({4}, {1, -2, 3, 0.5})));
    {
      grpc::ClientContext context;
      Prepare(&context);
      v1::Session session;
      ASSERT_TRUE(stub_->SetExportMode(&context, ExportReq(kExport, true), &session).ok());
      ASSERT_TRUE(session.export_mode());
    }
    Create(CreateReq(kBlock, "static", Spec("int8", v1::SYMMETRIC, PerBlockMulti({-1, 2}))));
    Observe(ObserveTensorReq(kBlock, F16({2, 4}, {1, -2, 3, 4, -5, 6, 7, 0.5})));
    const v1::HistogramParams bins256 = Params([](auto& p) { p.set_num_bins(256); });
    Create(CreateHistReq("percentile", Spec(), bins256, kHist));
    Observe(ObserveHistReq(kHist, {}));
    Create(CreateHistReq("mse", Spec(), bins256, kHistFull));
    Observe(HistReq(kHistFull, [](auto& f) { f.counts[128] = kHistogramValueLimit - 5; }));
    Create(CreateHistReq("entropy", Spec(), v1::HistogramParams(), kHistEmpty));
    for (const auto& [name, convention, amax] :
         {std::tuple{kNvfp4Ct, "compressed_tensors", 5.0},
          std::tuple{kNvfp4CtK, "compressed_tensors", 6.0}, std::tuple{kNvfp4Mo, "modelopt", 5.0}}) {
      v1::QuantSpec spec =
          WithScaleDType(Spec("float4_e2m1fn_x2", v1::SYMMETRIC, PerBlockAxis(-1, {16})),
                         "float8_e4m3fn");
      spec.set_convention(convention);
      Create(CreateReq(name, "global_minmax", spec));
      std::vector<double> values(64);
      for (size_t i = 0; i < values.size(); ++i) values[i] = amax * (static_cast<double>(i) / 32 - 1);
      Observe(ObserveTensorReq(name, F32({2, 32}, values)));
    }
    CreateGroups();
    tokens_.for_all = FirstPageToken("");
    tokens_.for_prefix = FirstPageToken(kPrefix);
    tokens_.for_groups = FirstGroupPageToken(kGroupPrefix);
  }

  void TearDown() override {
    std::remove(tokens_file_.c_str());
    std::remove(admin_tokens_file_.c_str());
  }

  // The sessions and groups of the kGrp* and kGroup* comments, for both tenants.
  void CreateGroups() {
    const v1::QuantSpec nvfp4 = [] {
      v1::QuantSpec spec = WithScaleDType(
          Spec("float4_e2m1fn_x2", v1::SYMMETRIC, PerBlockAxis(-1, {16})), "float8_e4m3fn");
      spec.set_convention("compressed_tensors");
      return spec;
    }();
    std::vector<double> values(64);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 3.0 * (static_cast<double>(i) / 32 - 1);
    for (const auto& [name, token, tensor] :
         {std::tuple{kGrpQ, kTokenA, F32({2, 32}, values)},
          std::tuple{kGrpK, kTokenA, F32({2, 32}, values)},
          std::tuple{kGrpV, kTokenA, Bf16({2, 32}, values)},
          std::tuple{kGrpQ, kTokenB, F32({2, 32}, values)},
          std::tuple{kBOnly, kTokenB, F32({2, 32}, values)}}) {
      Create(CreateReq(name, "global_minmax", nvfp4), token);
      Observe(ObserveTensorReq(name, tensor), token);
    }
    for (const char* name : {kGrpUa, kGrpUb, kGrpDoomed}) {
      Create(CreateReq(name, "static", Spec("int8")));
    }
    const int kGlobalAmax = v1::ScaleGroup::GLOBAL_AMAX;
    const int kUnionRange = v1::ScaleGroup::UNION_RANGE;
    CreateGroup(GroupReq(kGroupQk, {kGrpQ, kGrpK}, kGlobalAmax));
    CreateGroup(GroupReq(kGroupDtypes, {kGrpQ, kGrpV}, kGlobalAmax));
    CreateGroup(GroupReq(kGroupDrift, {kGrpUa, kGrpUb}, kUnionRange));
    CreateGroup(GroupReq(kGroupOrphan, {kGrpUa, kGrpDoomed}, kUnionRange));
    CreateGroup(GroupReq(kGroupHist, {kHist}, kUnionRange));
    CreateGroup(GroupReq(kGroupB, {kGrpQ}, kGlobalAmax), kTokenB);
    {
      grpc::ClientContext context;
      Prepare(&context);
      v1::Session session;
      ASSERT_TRUE(
          stub_->SetGranularity(&context, GranularityReq(kGrpUb, PerChannel(0)), &session).ok());
    }
    {
      grpc::ClientContext context;
      Prepare(&context);
      v1::DeleteSessionResponse response;
      ASSERT_TRUE(
          stub_->DeleteSession(&context, Named<v1::DeleteSessionRequest>(kGrpDoomed), &response)
              .ok());
    }
  }

  // A deadline, and the bearer token of the tenant the call is made for ("": none).
  static void Prepare(grpc::ClientContext* context, const std::string& token = kTokenA) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }

  // Runs `row`'s request; the status (for ObserveStream and a batch of one, the
  // item's status). `stream_response` receives the item's response, if any.
  grpc::Status Call(const Row& row, std::optional<v1::ObserveResponse>* stream_response,
                    std::string* stream_error) {
    grpc::ClientContext context;
    const char* holder = row.as_admin ? kAdminToken : row.as_tenant_b ? kTokenB : kTokenA;
    Prepare(&context, row.token.value_or(holder));
    switch (row.method) {
      case Method::kCompute: {
        v1::ComputeResponse response;
        return stub_->Compute(&context, std::get<v1::ComputeRequest>(row.request), &response);
      }
      case Method::kCreateSession: {
        v1::Session response;
        return stub_->CreateSession(&context, std::get<v1::CreateSessionRequest>(row.request),
                                    &response);
      }
      case Method::kGetSession: {
        v1::Session response;
        return stub_->GetSession(&context, std::get<v1::GetSessionRequest>(row.request), &response);
      }
      case Method::kListSessions: {
        v1::ListSessionsResponse response;
        return stub_->ListSessions(&context, std::get<v1::ListSessionsRequest>(row.request),
                                   &response);
      }
      case Method::kReadSessions: {
        std::unique_ptr<grpc::ClientReader<v1::Session>> reader =
            stub_->ReadSessions(&context, std::get<v1::ReadSessionsRequest>(row.request));
        v1::Session session;
        while (reader->Read(&session)) {
        }
        return reader->Finish();
      }
      case Method::kExportSessions: {
        std::unique_ptr<grpc::ClientReader<v1::ExportChunk>> reader =
            stub_->ExportSessions(&context, std::get<v1::ExportSessionsRequest>(row.request));
        v1::ExportChunk chunk;
        while (reader->Read(&chunk)) {
        }
        return reader->Finish();
      }
      case Method::kDeleteSession: {
        v1::DeleteSessionResponse response;
        return stub_->DeleteSession(&context, std::get<v1::DeleteSessionRequest>(row.request),
                                    &response);
      }
      case Method::kObserve: {
        v1::ObserveResponse response;
        return stub_->Observe(&context, std::get<v1::ObserveRequest>(row.request), &response);
      }
      case Method::kObserveStream: {
        auto stream = stub_->ObserveStream(&context);
        v1::ObserveResponse response;
        const bool wrote = stream->Write(std::get<v1::ObserveRequest>(row.request));
        const bool read = wrote && stream->Read(&response);
        stream->WritesDone();
        const grpc::Status finish = stream->Finish();
        if (!read || !finish.ok()) {
          *stream_error =
              absl::StrCat("the stream itself failed (wrote ", wrote, ", read ", read,
                           "): ", CodeName(finish.error_code()), ": ", finish.error_message());
          return finish.ok() ? grpc::Status(StatusCode::UNKNOWN, "no response") : finish;
        }
        *stream_response = response;
        return wire::ToGrpcStatus(wire::FromRpcStatus(response.status()));
      }
      case Method::kObserveBatch: {
        const auto& request = std::get<v1::ObserveBatchRequest>(row.request);
        v1::ObserveBatchResponse response;
        const grpc::Status status = stub_->ObserveBatch(&context, request, &response);
        if (!status.ok()) return status;
        if (response.responses_size() != request.observations_size()) {
          *stream_error = absl::StrCat("the batch answered ", response.responses_size(), " of ",
                                       request.observations_size(), " observations");
          return grpc::Status(StatusCode::UNKNOWN, "no response");
        }
        if (request.observations_size() != 1) {
          *stream_error = "a batch of more than one observation was answered";
          return grpc::Status::OK;
        }
        *stream_response = response.responses(0);
        return wire::ToGrpcStatus(wire::FromRpcStatus(response.responses(0).status()));
      }
      case Method::kGetQParams: {
        v1::GetQParamsResponse response;
        return stub_->GetQParams(&context, std::get<v1::GetQParamsRequest>(row.request), &response);
      }
      case Method::kGetHistogram: {
        v1::HistogramObservation response;
        return stub_->GetHistogram(&context, std::get<v1::GetHistogramRequest>(row.request),
                                   &response);
      }
      case Method::kSetExportMode: {
        v1::Session response;
        return stub_->SetExportMode(&context, std::get<v1::SetExportModeRequest>(row.request),
                                    &response);
      }
      case Method::kSetGranularity: {
        v1::Session response;
        return stub_->SetGranularity(&context, std::get<v1::SetGranularityRequest>(row.request),
                                     &response);
      }
      case Method::kCreateScaleGroup: {
        v1::ScaleGroup response;
        return stub_->CreateScaleGroup(
            &context, std::get<v1::CreateScaleGroupRequest>(row.request), &response);
      }
      case Method::kGetScaleGroup: {
        v1::ScaleGroup response;
        return stub_->GetScaleGroup(&context, std::get<v1::GetScaleGroupRequest>(row.request),
                                    &response);
      }
      case Method::kListScaleGroups: {
        v1::ListScaleGroupsResponse response;
        return stub_->ListScaleGroups(
            &context, std::get<v1::ListScaleGroupsRequest>(row.request), &response);
      }
      case Method::kDeleteScaleGroup: {
        v1::DeleteScaleGroupResponse response;
        return stub_->DeleteScaleGroup(
            &context, std::get<v1::DeleteScaleGroupRequest>(row.request), &response);
      }
      case Method::kGetGroupQParams: {
        v1::GroupQParams response;
        return stub_->GetGroupQParams(
            &context, std::get<v1::GetGroupQParamsRequest>(row.request), &response);
      }
      case Method::kSetSlotMap: {
        v1::Topology response;
        return admin_stub_->SetSlotMap(&context, std::get<v1::SetSlotMapRequest>(row.request),
                                       &response);
      }
    }
    return grpc::Status(StatusCode::INTERNAL, "unknown method");
  }

  // Every session and every group of both tenants, every field.
  struct Snapshot {
    v1::ListSessionsResponse sessions_a, sessions_b;
    v1::ListScaleGroupsResponse groups_a, groups_b;
  };
  Snapshot Store() {
    Snapshot snapshot;
    for (const auto& [token, sessions, groups] :
         {std::tuple{kTokenA, &snapshot.sessions_a, &snapshot.groups_a},
          std::tuple{kTokenB, &snapshot.sessions_b, &snapshot.groups_b}}) {
      grpc::ClientContext context;
      Prepare(&context, token);
      v1::ListSessionsRequest request;
      request.set_page_size(1000);
      const grpc::Status status = stub_->ListSessions(&context, request, sessions);
      EXPECT_TRUE(status.ok()) << status.error_message();
      grpc::ClientContext groups_context;
      Prepare(&groups_context, token);
      const grpc::Status listed =
          stub_->ListScaleGroups(&groups_context, ListGroupsReq(1000, "", ""), groups);
      EXPECT_TRUE(listed.ok()) << listed.error_message();
    }
    return snapshot;
  }

  void Create(const v1::CreateSessionRequest& request, const char* token = kTokenA) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::Session session;
    const grpc::Status status = stub_->CreateSession(&context, request, &session);
    ASSERT_TRUE(status.ok()) << request.name() << ": " << status.error_message();
  }
  void Observe(const v1::ObserveRequest& request, const char* token = kTokenA) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::ObserveResponse response;
    const grpc::Status status = stub_->Observe(&context, request, &response);
    ASSERT_TRUE(status.ok()) << request.name() << ": " << status.error_message();
  }
  std::string FirstPageToken(const std::string& filter) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ListSessionsResponse response;
    const grpc::Status status = stub_->ListSessions(&context, ListReq(1, "", filter), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(response.next_page_token().empty()) << filter;
    return response.next_page_token();
  }

  void CreateGroup(const v1::CreateScaleGroupRequest& request, const char* token = kTokenA) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::ScaleGroup group;
    const grpc::Status status = stub_->CreateScaleGroup(&context, request, &group);
    ASSERT_TRUE(status.ok()) << request.group().name() << ": " << status.error_message();
  }
  std::string FirstGroupPageToken(const std::string& filter) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ListScaleGroupsResponse response;
    const grpc::Status status =
        stub_->ListScaleGroups(&context, ListGroupsReq(1, "", filter), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(response.next_page_token().empty()) << filter;
    return response.next_page_token();
  }

  std::string tokens_file_, admin_tokens_file_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
  std::unique_ptr<v1::ClusterAdmin::Stub> admin_stub_;  // SetSlotMap
  Tokens tokens_;
};

TEST_P(Hardening, FailsWithTheRightCodeNamesTheFieldAndChangesNothing) {
  const Snapshot before = Store();
  ASSERT_EQ(before.sessions_a.sessions_size(), 15);
  ASSERT_TRUE(before.sessions_a.next_page_token().empty());
  ASSERT_EQ(before.sessions_b.sessions_size(), 2);
  ASSERT_EQ(before.groups_a.groups_size() + before.groups_b.groups_size(), kGroups);
  ASSERT_EQ(before.groups_b.groups_size(), 1);
  const std::vector<Row> rows = BadRequests(tokens_);
  ASSERT_LT(GetParam(), static_cast<int>(rows.size()));
  const Row& row = rows[GetParam()];
  ASSERT_NE(row.code, StatusCode::OK) << row.what;
  SCOPED_TRACE(absl::StrCat(MethodName(row.method), " [", row.what, "]"));

  std::optional<v1::ObserveResponse> stream_response;
  std::string stream_error;
  const grpc::Status status = Call(row, &stream_response, &stream_error);
  const std::string actual =
      absl::StrCat("got ", CodeName(status.error_code()), ": \"", status.error_message(), "\"");
  EXPECT_TRUE(stream_error.empty()) << stream_error;
  EXPECT_EQ(status.error_code(), row.code) << "expected " << CodeName(row.code) << ", " << actual;
  EXPECT_TRUE(absl::StrContains(status.error_message(), row.field))
      << "the message does not name \"" << row.field << "\"; " << actual;
  if (stream_response.has_value()) {
    // A failed stream response carries the session's current count and no qparams.
    const std::string& name =
        row.method == Method::kObserveBatch
            ? std::get<v1::ObserveBatchRequest>(row.request).observations(0).name()
            : std::get<v1::ObserveRequest>(row.request).name();
    int64_t count = 0;
    for (const v1::Session& s : before.sessions_a.sessions()) {
      if (s.name() == name) count = s.observation_count();
    }
    EXPECT_EQ(stream_response->observation_count(), count) << actual;
    EXPECT_FALSE(stream_response->has_qparams()) << actual;
  }
  const Snapshot after = Store();
  for (const auto& [what, was, is] :
       {std::tuple<const char*, const google::protobuf::Message*, const google::protobuf::Message*>{
            "tenant A's sessions", &before.sessions_a, &after.sessions_a},
        {"tenant B's sessions", &before.sessions_b, &after.sessions_b},
        {"tenant A's groups", &before.groups_a, &after.groups_a},
        {"tenant B's groups", &before.groups_b, &after.groups_b}}) {
    std::string diff;
    google::protobuf::util::MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differencer.Compare(*was, *is)) << what << " changed (" << actual << "):\n"
                                                << diff;
  }
}

// The rows' names (the table needs no server to be listed): the method and what the
// row holds, in letters and digits, numbered so that each is unique. Built once: the
// instantiation asks for the count and then for each name.
std::vector<std::string> MakeRowNames() {
  std::vector<std::string> names;
  for (const Row& row : BadRequests(Tokens{})) {
    std::string name = absl::StrCat(names.size(), "_", MethodName(row.method), "_");
    bool gap = false;
    for (char c : row.what) {
      if (absl::ascii_isalnum(static_cast<unsigned char>(c))) {
        if (gap && name.back() != '_') name.push_back('_');
        name.push_back(c);
        gap = false;
      } else {
        gap = true;
      }
    }
    names.push_back(std::move(name));
  }
  return names;
}

const std::vector<std::string>& RowNames() {
  static const std::vector<std::string>* const names =
      new std::vector<std::string>(MakeRowNames());
  return *names;
}

INSTANTIATE_TEST_SUITE_P(BadRequest, Hardening,
                         ::testing::Range(0, static_cast<int>(RowNames().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return RowNames()[info.param];
                         });

TEST(HardeningTable, HasARowForEveryMethodAndEnoughOfThem) {
  const std::vector<Row> rows = BadRequests(Tokens{});
  EXPECT_GE(rows.size(), 180u);
  std::set<Method> methods;
  for (const Row& row : rows) methods.insert(row.method);
  EXPECT_EQ(methods.size(), 20u);  // every Method
}

}  // namespace
}  // namespace qparams::testing
