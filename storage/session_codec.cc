#include "storage/session_codec.h"

#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/timestamp.h"
#include "core/observation.h"
#include "core/registry.h"
#include "core/status_macros.h"
#include "types/codec.h"

namespace qparams {
namespace {

namespace sv1 = storage::v1;

// The core values the records share with the wire (qparams/v1/types.proto) convert
// by the one codec: a stored spec or dtype reads as the wire's would.
using types::DTypeFromProto;
using types::DTypeToProto;

// A vector's bytes as a `bytes` field, and back (little-endian: the project builds
// for little-endian machines only, as the journal's frames say).
template <typename T>
std::string ToBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

template <typename T>
absl::StatusOr<std::vector<T>> FromBytes(const std::string& bytes, absl::string_view field) {
  if (bytes.size() % sizeof(T) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " holds ", bytes.size(), " bytes, not a whole number of values"));
  }
  std::vector<T> values(bytes.size() / sizeof(T));
  if (!values.empty()) std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

sv1::QParams EncodeQParams(const QParams& q) {
  sv1::QParams out;
  out.mutable_shape()->Assign(q.shape.begin(), q.shape.end());
  out.set_scale_f32(ToBytes(q.scale));
  out.set_zero_point_i32(ToBytes(q.zero_point));
  out.set_minval_f32(ToBytes(q.minval));
  out.set_has_zero_point(q.has_zero_point);
  out.set_has_minval(q.has_minval);
  if (q.precision) out.set_precision(DTypeToProto(*q.precision));
  if (!q.scale_e4m3.empty()) out.set_scale_e4m3(ToBytes(q.scale_e4m3));
  if (q.global_scale) out.set_global_scale(*q.global_scale);
  if (q.amax) out.set_amax(*q.amax);
  return out;
}

absl::StatusOr<QParams> DecodeQParams(const sv1::QParams& q) {
  QParams out;
  out.shape.assign(q.shape().begin(), q.shape().end());
  // Directories written before the bytes fields hold repeated fields instead.
  if (!q.scale_f32().empty() || q.scale().empty()) {
    QPARAMS_ASSIGN_OR_RETURN(out.scale, FromBytes<float>(q.scale_f32(), "qparams.scale_f32"));
    QPARAMS_ASSIGN_OR_RETURN(out.zero_point,
                             FromBytes<int32_t>(q.zero_point_i32(), "qparams.zero_point_i32"));
    QPARAMS_ASSIGN_OR_RETURN(out.minval, FromBytes<float>(q.minval_f32(), "qparams.minval_f32"));
  } else {
    out.scale.assign(q.scale().begin(), q.scale().end());
    out.zero_point.assign(q.zero_point().begin(), q.zero_point().end());
    out.minval.assign(q.minval().begin(), q.minval().end());
  }
  out.has_zero_point = q.has_zero_point();
  out.has_minval = q.has_minval();
  if (q.precision() != v1::DTYPE_UNSPECIFIED) {
    QPARAMS_ASSIGN_OR_RETURN(out.precision, DTypeFromProto(q.precision(), "qparams.precision"));
  }
  // The calculator checks these against its spec when it restores them.
  out.scale_e4m3.assign(q.scale_e4m3().begin(), q.scale_e4m3().end());
  if (q.has_global_scale()) out.global_scale = q.global_scale();
  if (q.has_amax()) out.amax = q.amax();
  return out;
}

sv1::Histogram EncodeHistogram(const Histogram& h) {
  sv1::Histogram out;
  out.set_num_bins(h.num_bins);
  out.set_exponent(h.exponent);
  out.set_counts_u64(ToBytes(h.counts));
  out.set_zero_count(h.zero_count);
  out.set_negative_count(h.negative_count);
  out.set_nan_count(h.nan_count);
  out.set_posinf_count(h.posinf_count);
  out.set_neginf_count(h.neginf_count);
  if (h.min) out.set_min(*h.min);
  if (h.max) out.set_max(*h.max);
  return out;
}

// The calculator checks the histogram (ValidateHistogramState) when it restores it.
absl::StatusOr<Histogram> DecodeHistogram(const sv1::Histogram& h) {
  Histogram out;
  out.num_bins = h.num_bins();
  out.exponent = h.exponent();
  QPARAMS_ASSIGN_OR_RETURN(out.counts, FromBytes<uint64_t>(h.counts_u64(), "histogram.counts_u64"));
  out.zero_count = h.zero_count();
  out.negative_count = h.negative_count();
  out.nan_count = h.nan_count();
  out.posinf_count = h.posinf_count();
  out.neginf_count = h.neginf_count();
  if (h.has_min()) out.min = h.min();
  if (h.has_max()) out.max = h.max();
  return out;
}

}  // namespace

sv1::SessionKey EncodeKey(const SessionKey& key) {
  sv1::SessionKey out;
  out.set_tenant(key.tenant);
  out.set_name(key.name);
  return out;
}

SessionKey DecodeKey(const sv1::SessionKey& key) { return {key.tenant(), key.name()}; }

sv1::Record EncodeEviction(const SessionKey& key, absl::Time evict_time) {
  sv1::Record record;
  *record.mutable_evicted()->mutable_key() = EncodeKey(key);
  *record.mutable_evicted()->mutable_evict_time() = TimestampFromTime(evict_time);
  return record;
}

namespace {

void EncodeRange(const WorkingRange& range, sv1::RunningRange& out) {
  out.set_precision(DTypeToProto(range.precision));
  out.mutable_shape()->Assign(range.shape.begin(), range.shape.end());
  out.mutable_lo()->Assign(range.lo.begin(), range.lo.end());
  out.mutable_hi()->Assign(range.hi.begin(), range.hi.end());
}

absl::StatusOr<WorkingRange> DecodeRange(const sv1::RunningRange& r, absl::string_view field) {
  absl::StatusOr<DType> precision =
      DTypeFromProto(r.precision(), absl::StrCat(field, ".precision"));
  if (!precision.ok()) return precision.status();
  return WorkingRange{*precision,
                      {r.shape().begin(), r.shape().end()},
                      {r.lo().begin(), r.lo().end()},
                      {r.hi().begin(), r.hi().end()}};
}

}  // namespace

namespace {

void EncodeStepRange(const ReducedRange& r, sv1::StepRange& out) {
  out.mutable_input_shape()->Assign(r.input_shape.begin(), r.input_shape.end());
  out.set_dtype(DTypeToProto(r.range.min.dtype));
  out.mutable_shape()->Assign(r.range.min.shape.begin(), r.range.min.shape.end());
  out.set_min(std::string(r.range.min.data.view()));
  out.set_max(std::string(r.range.max.data.view()));
}

// Its values are checked where the range is used (StepMerge::FromState, the merge).
absl::StatusOr<ReducedRange> DecodeStepRange(const sv1::StepRange& m, absl::string_view field) {
  QPARAMS_ASSIGN_OR_RETURN(const DType dtype,
                           DTypeFromProto(m.dtype(), absl::StrCat(field, ".dtype")));
  const Shape shape(m.shape().begin(), m.shape().end());
  return ReducedRange{
      {m.input_shape().begin(), m.input_shape().end()},
      BlockRange{Tensor{dtype, shape, Bytes(m.min())}, Tensor{dtype, shape, Bytes(m.max())}}};
}

sv1::Steps EncodeSteps(const StepState& state) {
  sv1::Steps out;
  out.set_last_applied(state.last_applied);
  for (const StepState::Pending& p : state.pending) {
    sv1::PendingStep* step = out.add_pending();
    step->set_step(p.step);
    step->set_world_size(p.world_size);
    std::string bits((p.contributed.size() + 7) / 8, '\0');
    for (size_t r = 0; r < p.contributed.size(); ++r) {
      if (p.contributed[r]) bits[r / 8] = static_cast<char>(bits[r / 8] | (1 << (r % 8)));
    }
    step->set_contributed(std::move(bits));
    if (p.merged) EncodeStepRange(*p.merged, *step->mutable_merged());
  }
  for (const StepState::Applied& a : state.applied) {
    sv1::AppliedStep* step = out.add_applied();
    step->set_step(a.step);
    *step->mutable_qparams() = EncodeQParams(a.qparams);
  }
  for (const IncompleteStep& i : state.incomplete) {
    sv1::IncompleteStep* step = out.add_incomplete();
    step->set_step(i.step);
    step->set_world_size(i.world_size);
    step->mutable_missing_ranks()->Assign(i.missing_ranks.begin(), i.missing_ranks.end());
  }
  return out;
}

absl::StatusOr<StepMerge> DecodeSteps(const sv1::Steps& steps) {
  StepState state;
  state.last_applied = steps.last_applied();
  for (const sv1::PendingStep& p : steps.pending()) {
    StepState::Pending& pending = state.pending.emplace_back();
    pending.step = p.step();
    pending.world_size = p.world_size();
    if (p.world_size() < 1 ||
        p.contributed().size() != (static_cast<size_t>(p.world_size()) + 7) / 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("steps: pending step ", p.step(), " has ", p.contributed().size(),
                       " bytes of ranks for world_size ", p.world_size()));
    }
    pending.contributed.resize(p.world_size());
    for (int32_t r = 0; r < p.world_size(); ++r) {
      pending.contributed[r] = (static_cast<uint8_t>(p.contributed()[r / 8]) >> (r % 8)) & 1;
    }
    if (p.has_merged()) {
      QPARAMS_ASSIGN_OR_RETURN(pending.merged, DecodeStepRange(p.merged(), "steps.merged"));
    }
  }
  for (const sv1::AppliedStep& a : steps.applied()) {
    QPARAMS_ASSIGN_OR_RETURN(QParams qparams, DecodeQParams(a.qparams()));
    state.applied.push_back({a.step(), std::move(qparams)});
  }
  for (const sv1::IncompleteStep& i : steps.incomplete()) {
    state.incomplete.push_back(
        {i.step(), i.world_size(), {i.missing_ranks().begin(), i.missing_ranks().end()}});
  }
  return StepMerge::FromState(std::move(state));
}

}  // namespace

sv1::SessionState EncodeSession(const SessionKey& key, const CalculatorState& state,
                                absl::Time create_time, absl::Time update_time,
                                const DedupeWindow& dedupe, const std::optional<StepState>& steps) {
  sv1::SessionState out;
  *out.mutable_key() = EncodeKey(key);
  out.set_calculator(state.calculator);
  *out.mutable_spec() = types::SpecToProto(state.spec);
  if (state.averaging_constant) out.set_averaging_constant(*state.averaging_constant);
  out.set_initialized(state.initialized);
  out.set_export_mode(state.export_mode);
  out.set_compute_dtype_for_export(DTypeToProto(state.compute_dtype_for_export));
  out.set_observation_count(state.observation_count);
  *out.mutable_qparams() = EncodeQParams(state.qparams);
  if (state.running) EncodeRange(*state.running, *out.mutable_running());
  if (state.last_range) EncodeRange(*state.last_range, *out.mutable_last_range());
  if (state.histogram_params) {
    *out.mutable_histogram_params() = types::HistogramParamsToProto(*state.histogram_params);
  }
  if (state.histogram) *out.mutable_histogram() = EncodeHistogram(*state.histogram);
  *out.mutable_create_time() = TimestampFromTime(create_time);
  *out.mutable_update_time() = TimestampFromTime(update_time);
  for (const DedupeWindow::Client& client : dedupe.clients()) {
    sv1::ObserveClient* c = out.add_observe_clients();
    c->set_client_id(client.id);
    for (const DedupeWindow::Applied& applied : client.applied) {
      c->add_sequences(applied.sequence);
      c->add_observation_counts(applied.observation_count);
    }
  }
  if (steps) *out.mutable_steps() = EncodeSteps(*steps);
  return out;
}

absl::StatusOr<DecodedSession> DecodeSession(const sv1::SessionState& record) {
  const SessionKey key = DecodeKey(record.key());
  auto invalid = [&](const absl::Status& status) {
    return absl::InvalidArgumentError(absl::StrCat("session \"", key.name, "\" (tenant \"",
                                                   key.tenant, "\"): ", status.message()));
  };
  CalculatorState state;
  state.calculator = record.calculator();
  absl::StatusOr<QuantSpec> spec = types::SpecFromProto(record.spec());
  if (!spec.ok()) return invalid(spec.status());
  state.spec = *std::move(spec);
  if (record.has_averaging_constant()) state.averaging_constant = record.averaging_constant();
  state.initialized = record.initialized();
  state.export_mode = record.export_mode();
  absl::StatusOr<DType> dtype =
      DTypeFromProto(record.compute_dtype_for_export(), "compute_dtype_for_export");
  if (!dtype.ok()) return invalid(dtype.status());
  state.compute_dtype_for_export = *dtype;
  state.observation_count = record.observation_count();
  absl::StatusOr<QParams> qparams = DecodeQParams(record.qparams());
  if (!qparams.ok()) return invalid(qparams.status());
  state.qparams = *std::move(qparams);
  if (record.has_running()) {
    absl::StatusOr<WorkingRange> running = DecodeRange(record.running(), "running");
    if (!running.ok()) return invalid(running.status());
    state.running = *std::move(running);
  }
  if (record.has_last_range()) {
    absl::StatusOr<WorkingRange> last = DecodeRange(record.last_range(), "last_range");
    if (!last.ok()) return invalid(last.status());
    state.last_range = *std::move(last);
  }
  if (record.has_histogram_params()) {
    absl::StatusOr<HistogramParams> params =
        types::HistogramParamsFromProto(record.histogram_params(), "histogram_params");
    if (!params.ok()) return invalid(params.status());
    state.histogram_params = *std::move(params);
  }
  if (record.has_histogram()) {
    absl::StatusOr<Histogram> histogram = DecodeHistogram(record.histogram());
    if (!histogram.ok()) return invalid(histogram.status());
    state.histogram = *std::move(histogram);
  }
  std::vector<DedupeWindow::Client> clients;
  clients.reserve(record.observe_clients_size());
  for (const sv1::ObserveClient& c : record.observe_clients()) {
    if (c.sequences_size() != c.observation_counts_size()) {
      return invalid(absl::InvalidArgumentError(
          absl::StrCat("the dedupe window's client \"", c.client_id(),
                       "\" has a count for each of some but not all of its sequences")));
    }
    DedupeWindow::Client& client = clients.emplace_back();
    client.id = c.client_id();
    for (int i = 0; i < c.sequences_size(); ++i) {
      client.applied.push_back({c.sequences(i), c.observation_counts(i)});
    }
  }
  absl::StatusOr<DedupeWindow> dedupe = DedupeWindow::FromClients(std::move(clients));
  if (!dedupe.ok()) return invalid(dedupe.status());
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> calculator =
      CreateStatefulFromState(std::move(state));
  if (!calculator.ok()) return invalid(calculator.status());
  DecodedSession out;
  if (record.has_steps()) {
    absl::StatusOr<StepMerge> steps = DecodeSteps(record.steps());
    if (!steps.ok()) return invalid(steps.status());
    // A pending range is checked as a contribution is, against the calculator.
    for (const StepState::Pending& p : steps->ExportState().pending) {
      if (!p.merged) continue;
      absl::Status checked =
          (*calculator)
              ->ReduceRange(Observation::FromRange(
                  p.merged->input_shape, p.merged->range.min.view(), p.merged->range.max.view()))
              .status();
      if (!checked.ok()) {
        return invalid(absl::InvalidArgumentError(
            absl::StrCat("steps: pending step ", p.step, ": ", checked.message())));
      }
    }
    out.steps = *std::move(steps);
  }
  out.dedupe = *std::move(dedupe);
  out.key = key;
  out.calculator = *std::move(calculator);
  out.create_time = TimeFromTimestamp(record.create_time());
  out.update_time = TimeFromTimestamp(record.update_time());
  return out;
}

sv1::Record EncodeContribution(const SessionKey& key, const StepContribution& c,
                               absl::Time update_time) {
  sv1::Record record;
  sv1::StepContributed& out = *record.mutable_contributed();
  *out.mutable_key() = EncodeKey(key);
  out.set_step(c.step);
  out.set_rank(c.rank);
  out.set_world_size(c.world_size);
  if (c.range) EncodeStepRange(*c.range, *out.mutable_range());
  *out.mutable_update_time() = TimestampFromTime(update_time);
  return record;
}

absl::StatusOr<DecodedContribution> DecodeContribution(const sv1::StepContributed& record) {
  DecodedContribution out;
  out.key = DecodeKey(record.key());
  out.contribution.step = record.step();
  out.contribution.rank = record.rank();
  out.contribution.world_size = record.world_size();
  if (record.has_range()) {
    QPARAMS_ASSIGN_OR_RETURN(out.contribution.range, DecodeStepRange(record.range(), "range"));
  }
  out.update_time = TimeFromTimestamp(record.update_time());
  return out;
}

}  // namespace qparams
