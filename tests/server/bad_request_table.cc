// The helpers of bad_request_table.h: the rows' requests, and the kinds of row that
// several subsystems' tables share.

#include "tests/server/bad_request_table.h"

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "proto/convert.h"
#include "tests/support/test_util.h"

namespace qparams::testing::bad_request {
namespace {

DType CoreDType(v1::DType dtype) { return *wire::DTypeFromProto(dtype, "dtype"); }

}  // namespace

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
v1::Tensor RawTensor(int dtype, const std::vector<int64_t>& shape, std::string data) {
  v1::Tensor t;
  t.set_dtype(static_cast<v1::DType>(dtype));
  for (int64_t d : shape) t.add_shape(d);
  t.set_data(std::move(data));
  return t;
}
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

v1::QuantSpec Spec(const std::string& dtype, v1::QScheme qscheme,
                   const v1::Granularity& granularity, v1::Target target) {
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
                                   std::optional<double> averaging_constant) {
  v1::CreateSessionRequest r;
  r.set_name(name);
  r.set_calculator(calculator);
  *r.mutable_spec() = spec;
  if (averaging_constant) r.set_averaging_constant(*averaging_constant);
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
v1::CreateSessionRequest CreateHistReq(const std::string& calculator, const v1::QuantSpec& spec,
                                       const v1::HistogramParams& params, const std::string& name) {
  v1::CreateSessionRequest r = CreateReq(name, calculator, spec);
  *r.mutable_histogram() = params;
  return r;
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
v1::CreateScaleGroupRequest GroupReq(const std::string& name,
                                     const std::vector<std::string>& members, int share,
                                     bool fill_uncalibrated) {
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

void Table::Add(Row row) { rows_.push_back(std::move(row)); }

void Table::Add(std::string what, Method method, Request request, StatusCode code,
                std::string field) {
  rows_.push_back({std::move(what), method, std::move(request), code, std::move(field)});
}

void Table::Compute(std::string what, const v1::Tensor& tensor, StatusCode code, std::string field,
                    const v1::QuantSpec& spec, const std::string& calculator) {
  Add(std::move(what), Method::kCompute, ComputeReq(calculator, spec, tensor), code,
      std::move(field));
}

void Table::Create(std::string what, const v1::QuantSpec& spec, StatusCode code, std::string field,
                   const std::string& calculator, std::optional<double> averaging_constant,
                   const std::string& name) {
  Add(std::move(what), Method::kCreateSession,
      CreateReq(name, calculator, spec, averaging_constant), code, std::move(field));
}

void Table::Observe(std::string what, v1::ObserveRequest request, StatusCode code,
                    std::string field) {
  Add(std::move(what), Method::kObserve, std::move(request), code, std::move(field));
}

void Table::Stream(std::string what, v1::ObserveRequest request, StatusCode code,
                   std::string field) {
  v1::ObserveBatchRequest batch;
  *batch.add_observations() = request;
  Add(what, Method::kObserveStream, std::move(request), code, field);
  Add(std::move(what), Method::kObserveBatch, std::move(batch), code, std::move(field));
}

void Table::ExportSessions(const std::string& what, const std::string& prefix,
                           const std::string& format, bool allow_uninitialized, StatusCode code,
                           const std::string& field) {
  v1::ExportSessionsRequest request;
  request.set_prefix(prefix);
  request.set_format(format);
  request.set_allow_uninitialized(allow_uninitialized);
  Add(absl::StrCat("export ", what), Method::kExportSessions, request, code, field);
}

}  // namespace qparams::testing::bad_request
