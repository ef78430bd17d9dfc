#include "server/session_codec.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/registry.h"
#include "proto/convert.h"

namespace qparams {

storage::v1::SessionKey EncodeKey(const SessionKey& key) {
  storage::v1::SessionKey out;
  out.set_tenant(key.tenant);
  out.set_name(key.name);
  return out;
}

SessionKey DecodeKey(const storage::v1::SessionKey& key) { return {key.tenant(), key.name()}; }

storage::v1::SessionState EncodeSession(const SessionKey& key, const CalculatorState& state,
                                        absl::Time create_time, absl::Time update_time) {
  storage::v1::SessionState out;
  *out.mutable_key() = EncodeKey(key);
  out.set_calculator(state.calculator);
  *out.mutable_spec() = wire::SpecToProto(state.spec);
  if (state.averaging_constant) out.set_averaging_constant(*state.averaging_constant);
  out.set_initialized(state.initialized);
  out.set_export_mode(state.export_mode);
  out.set_compute_dtype_for_export(wire::DTypeToProto(state.compute_dtype_for_export));
  out.set_observation_count(state.observation_count);
  *out.mutable_qparams() = wire::QParamsToProto(state.qparams);
  if (state.running) {
    storage::v1::RunningRange* running = out.mutable_running();
    running->set_precision(wire::DTypeToProto(state.running->precision));
    running->mutable_shape()->Assign(state.running->shape.begin(), state.running->shape.end());
    running->mutable_lo()->Assign(state.running->lo.begin(), state.running->lo.end());
    running->mutable_hi()->Assign(state.running->hi.begin(), state.running->hi.end());
  }
  *out.mutable_create_time() = wire::TimeToProto(create_time);
  *out.mutable_update_time() = wire::TimeToProto(update_time);
  return out;
}

absl::StatusOr<DecodedSession> DecodeSession(const storage::v1::SessionState& record) {
  const SessionKey key = DecodeKey(record.key());
  auto invalid = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("session \"", key.name, "\" (tenant \"", key.tenant, "\"): ", what));
  };
  CalculatorState state;
  state.calculator = record.calculator();
  absl::StatusOr<QuantSpec> spec = wire::SpecFromProto(record.spec());
  if (!spec.ok()) return invalid(spec.status().message());
  state.spec = *std::move(spec);
  if (record.has_averaging_constant()) state.averaging_constant = record.averaging_constant();
  state.initialized = record.initialized();
  state.export_mode = record.export_mode();
  absl::StatusOr<DType> dtype =
      wire::DTypeFromProto(record.compute_dtype_for_export(), "compute_dtype_for_export");
  if (!dtype.ok()) return invalid(dtype.status().message());
  state.compute_dtype_for_export = *dtype;
  state.observation_count = record.observation_count();
  state.qparams = wire::QParamsFromProto(record.qparams());
  if (record.has_running()) {
    const storage::v1::RunningRange& r = record.running();
    absl::StatusOr<DType> precision = wire::DTypeFromProto(r.precision(), "running.precision");
    if (!precision.ok()) return invalid(precision.status().message());
    state.running = WorkingRange{*precision,
                                 {r.shape().begin(), r.shape().end()},
                                 {r.lo().begin(), r.lo().end()},
                                 {r.hi().begin(), r.hi().end()}};
  }
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> calculator =
      CreateStatefulFromState(state);
  if (!calculator.ok()) return invalid(calculator.status().message());
  DecodedSession out;
  out.key = key;
  out.calculator = *std::move(calculator);
  out.create_time = wire::TimeFromProto(record.create_time());
  out.update_time = wire::TimeFromProto(record.update_time());
  return out;
}

}  // namespace qparams
