#include "domain/engine.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/page_token.h"
#include "common/slot.h"
#include "core/status_macros.h"
#include "domain/recovery.h"

namespace qparams {
namespace {

const QParamsCalculatorRegistry& Registry() { return QParamsCalculatorRegistry::Global(); }

absl::Status CheckFilter(absl::string_view filter) { return ValidateSessionName(filter, "filter"); }

std::string Bound(const std::optional<double>& v) { return v ? absl::StrCat(*v) : "unset"; }

// The first field in which two resolved specs differ, with both values, for the
// message that refuses grouping them ("" when they are equal).
std::string SpecDifference(const QuantSpec& a, const QuantSpec& b) {
  auto differ = [](absl::string_view field, absl::string_view x, absl::string_view y) {
    return absl::StrCat(field, " ", x, " vs ", y);
  };
  if (a.dtype != b.dtype) return differ("dtype", a.dtype, b.dtype);
  if (a.qscheme != b.qscheme) return differ("qscheme", QSchemeName(a.qscheme), QSchemeName(b.qscheme));
  if (!(a.granularity == b.granularity)) {
    return differ("granularity", a.granularity.ToString(), b.granularity.ToString());
  }
  if (a.target != b.target) return differ("target", TargetName(a.target), TargetName(b.target));
  if (a.quant_min != b.quant_min || a.quant_max != b.quant_max) {
    return differ("quant range", absl::StrCat("[", Bound(a.quant_min), ", ", Bound(a.quant_max), "]"),
                  absl::StrCat("[", Bound(b.quant_min), ", ", Bound(b.quant_max), "]"));
  }
  if (a.float_range.min != b.float_range.min || a.float_range.max != b.float_range.max) {
    return differ("float_range",
                  absl::StrCat("[", Bound(a.float_range.min), ", ", Bound(a.float_range.max), "]"),
                  absl::StrCat("[", Bound(b.float_range.min), ", ", Bound(b.float_range.max), "]"));
  }
  if (a.scale_dtype != b.scale_dtype) {
    return differ("scale_dtype", a.scale_dtype.empty() ? "unset" : a.scale_dtype,
                  b.scale_dtype.empty() ? "unset" : b.scale_dtype);
  }
  if (a.range_calculator != b.range_calculator) {
    return differ("range_calculator", a.range_calculator, b.range_calculator);
  }
  if (a.convention != b.convention) return differ("convention", a.convention, b.convention);
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(EngineOptions options) {
  if (options.journal.data_dir.empty()) return std::make_unique<Engine>(std::move(options));
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Journal> owned, Journal::Open(options.journal));
  Journal& journal = *owned;
  Env& env = *options.journal.env;
  const std::string dir = options.journal.data_dir;
  if (options.slot_map != nullptr) {
    QPARAMS_ASSIGN_OR_RETURN(options.slot_map,
                             SlotOwnership::ChooseSlotMap(env, dir, options.slot_map));
  }
  std::unique_ptr<Engine> engine(new Engine(std::move(options), std::move(owned)));
  QPARAMS_RETURN_IF_ERROR(EngineRecords::Recover(*engine, journal));
  QPARAMS_RETURN_IF_ERROR(engine->ownership_.PersistIn(env, dir));
  // Last: a short session_ttl must not evict what a long restore brought back.
  engine->StartEviction();
  return engine;
}

Engine::Engine(EngineOptions options)
    : Engine(std::move(options), std::make_unique<NullSessionLog>()) {
  StartEviction();
}

Engine::Engine(EngineOptions options, std::unique_ptr<SessionLog> log)
    : options_(std::move(options)),
      ownership_(options_.slot_map, options_.replica_id),
      log_(std::move(log)),
      store_(options_.max_sessions, *log_),
      groups_(options_.max_scale_groups, *log_),
      migration_(ownership_, store_, groups_, *log_),
      step_timer_(std::make_unique<StepTimer>(
          [this](const SessionKey& key, int64_t step, absl::Duration timeout) {
            ExpireStep(key, step, timeout);
          })) {}

void Engine::StartEviction() {
  if (options_.session_ttl <= absl::ZeroDuration()) return;
  // Idle sessions are found within a tenth of the TTL (at most a minute) of it.
  const absl::Duration period = std::min(options_.session_ttl / 10, absl::Minutes(1));
  evictor_ = std::thread([this, period] {
    while (!stop_.WaitForNotificationWithTimeout(period)) {
      const absl::Time now = options_.eviction_clock ? options_.eviction_clock() : absl::Now();
      if (int evicted = EvictIdle(now); evicted > 0) {
        LogInfo(absl::StrCat("evicted ", evicted, " idle session(s) (--session_ttl ",
                             absl::FormatDuration(options_.session_ttl), ")"));
      }
    }
  });
}

Engine::~Engine() {
  step_timer_.reset();  // no step closes once the engine starts going
  stop_.Notify();
  if (evictor_.joinable()) evictor_.join();
  // Before the store goes, for the journal's compactions read it; as ~Journal does,
  // the error is dropped (the server closes the engine first and logs it).
  log_->Close().IgnoreError();
}

int Engine::EvictIdle(absl::Time now) {
  if (options_.session_ttl <= absl::ZeroDuration()) return 0;
  const absl::Time idle_since = now - options_.session_ttl;
  int evicted = 0;
  for (const std::shared_ptr<Session>& session : store_.IdleSessions(idle_since)) {
    // Under the slot's gate, as a write: a session of a slot being moved stays, or
    // the copy on the target would outlive it on the source.
    const SlotOwnership::WriteAdmission admission(ownership_, session->name());
    if (admission.state() != SlotMoveState::kStable) continue;
    evicted += store_.EvictIfIdle(session, idle_since);
  }
  return evicted;
}

std::vector<const CalculatorClass*> Engine::ListCalculators() const {
  return Registry().ListRegistryValues();
}

absl::StatusOr<QParams> Engine::Compute(absl::string_view calculator, const QuantSpec& spec,
                                        const Observation& x) const {
  const absl::string_view key = calculator.empty() ? "dynamic" : calculator;
  if (key != "dynamic" && key != "static") {
    absl::StatusOr<const CalculatorClass*> cls = Registry().Resolve(key);
    if (!cls.ok()) return cls.status();
    return absl::InvalidArgumentError(
        absl::StrCat("calculator \"", key, "\" keeps state across observations; Compute takes "
                     "\"dynamic\" or \"static\", use CreateSession for a stateful calculator"));
  }
  absl::StatusOr<std::unique_ptr<QParamsCalculatorBase>> c = Registry().Create(key, spec);
  if (!c.ok()) return c.status();
  return (*c)->Forward(x);
}

absl::StatusOr<SessionInfo> Engine::CreateSession(absl::string_view tenant, absl::string_view name,
                                                  absl::string_view calculator,
                                                  const QuantSpec& spec,
                                                  const CalculatorOptions& options) {
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
  absl::StatusOr<std::string> key = Registry().ResolveKey(calculator, spec.target);
  if (!key.ok()) return key.status();
  absl::StatusOr<const CalculatorClass*> cls = Registry().Resolve(*key);
  if (!cls.ok()) return cls.status();
  if (!(*cls)->stateful) {
    return absl::InvalidArgumentError(absl::StrCat(
        "calculator \"", *key,
        "\" is stateless, so a session of it would hold nothing; use "
        "Compute for it, or a stateful calculator (static, moving_average, global_minmax, "
        "percentile, entropy, mse)"));
  }
  absl::StatusOr<std::unique_ptr<StatefulQParamsCalculatorBase>> c =
      Registry().CreateStateful(*key, spec, options);
  if (!c.ok()) return c.status();
  absl::StatusOr<std::shared_ptr<Session>> session =
      store_.Create({std::string(tenant), std::string(name)}, *std::move(c));
  if (!session.ok()) return session.status();
  return (*session)->Info();
}

absl::StatusOr<std::shared_ptr<Session>> Engine::Find(const SlotOwnership::ReadAdmission& admission,
                                                      absl::string_view tenant) const {
  QPARAMS_RETURN_IF_ERROR(admission.CheckOwned());
  return store_.Find({std::string(tenant), std::string(admission.name())});
}

absl::StatusOr<SessionInfo> Engine::GetSession(absl::string_view tenant,
                                               absl::string_view name) const {
  const SlotOwnership::ReadAdmission admission(ownership_, name);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(admission, tenant);
  if (!session.ok()) return session.status();
  return (*session)->Info();
}

absl::Status Engine::DeleteSession(absl::string_view tenant, absl::string_view name) {
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
  return store_.Erase({std::string(tenant), std::string(name)});
}

absl::StatusOr<SessionPage> Engine::ListSessions(absl::string_view tenant, int page_size,
                                                 absl::string_view page_token,
                                                 absl::string_view filter) const {
  const SlotOwnership::ReadAdmission admission(ownership_);
  QPARAMS_ASSIGN_OR_RETURN(const PageStart start,
                           StartPage(page_size, page_token, filter, CheckFilter));
  // Sharded: only the sessions this replica owns.
  SessionStore::Page page =
      admission.map() == nullptr
          ? store_.List(tenant, filter, start.after, start.limit)
          : store_.List(tenant, filter, start.after, start.limit,
                        [&admission](absl::string_view name) { return admission.Owns(name); });
  SessionPage out;
  out.sessions.reserve(page.sessions.size());
  for (const std::shared_ptr<Session>& session : page.sessions) {
    out.sessions.push_back(session->Info());
  }
  if (page.more) out.next_page_token = EncodePageToken(filter, page.sessions.back()->name());
  return out;
}

ObserveOutcome Engine::Observe(absl::string_view tenant, absl::string_view name,
                               const absl::StatusOr<Observation>& x, bool omit_qparams,
                               const std::optional<ObserveKey>& key) {
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(admission.read(), tenant);
  absl::Status status = x.status();
  if (status.ok() && key) status = ValidateObserveKey(*key);
  if (status.ok()) status = session.status();
  if (status.ok()) status = admission.CheckWritable();
  if (status.ok()) {
    absl::StatusOr<ObserveResult> result = (*session)->Observe(*x, omit_qparams, key);
    if (result.ok()) {
      if (options_.observations != nullptr && !result->duplicate) {
        options_.observations->Increment();
      }
      return {absl::OkStatus(), *std::move(result)};
    }
    status = result.status();
  }
  ObserveOutcome failed{std::move(status), {}};
  if (session.ok()) failed.result.observation_count = (*session)->observation_count();
  return failed;
}

absl::StatusOr<CachedQParams> Engine::GetQParams(absl::string_view tenant,
                                                 absl::string_view name) const {
  const SlotOwnership::ReadAdmission admission(ownership_, name);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(admission, tenant);
  if (!session.ok()) return session.status();
  return (*session)->GetQParams();
}

absl::StatusOr<Histogram> Engine::GetHistogram(absl::string_view tenant,
                                               absl::string_view name) const {
  const SlotOwnership::ReadAdmission admission(ownership_, name);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(admission, tenant);
  if (!session.ok()) return session.status();
  return (*session)->GetHistogram();
}

absl::StatusOr<SessionInfo> Engine::SetExportMode(absl::string_view tenant,
                                                  absl::string_view name, bool enabled) {
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(admission.read(), tenant);
  if (!session.ok()) return session.status();
  QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
  QPARAMS_RETURN_IF_ERROR((*session)->SetExportMode(enabled));
  return (*session)->Info();
}

absl::StatusOr<SessionInfo> Engine::SetGranularity(absl::string_view tenant, absl::string_view name,
                                                   const std::optional<Granularity>& granularity) {
  if (!granularity.has_value()) {
    return absl::InvalidArgumentError(
        "granularity is unset; set per_tensor, per_channel or per_block");
  }
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(admission.read(), tenant);
  if (!session.ok()) return session.status();
  QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
  QPARAMS_RETURN_IF_ERROR((*session)->SetGranularity(*granularity));
  return (*session)->Info();
}

// ---- Scale groups ----

absl::StatusOr<ScaleGroupInfo> Engine::CreateScaleGroup(absl::string_view tenant,
                                                        const ScaleGroupRequest& request) {
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(request.name, "group.name"));
  const SlotOwnership::WriteAdmission admission(ownership_, request.name);
  QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
  QPARAMS_RETURN_IF_ERROR(ValidateGroupMembers(request.members));
  if (!request.share.has_value()) {
    return absl::InvalidArgumentError(
        "group.share is unset (SHARE_UNSPECIFIED) or not a known value; set GLOBAL_AMAX (NVFP4) "
        "or UNION_RANGE");
  }
  if (admission.read().map() != nullptr) {
    const int slot = admission.slot();
    std::vector<std::string> names, slots;
    for (const std::string& member : request.members) {
      if (const int s = SlotOf(member); s != slot) {
        names.push_back(absl::StrCat("\"", member, "\""));
        slots.push_back(absl::StrCat(s));
      }
    }
    if (!names.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "members ", absl::StrJoin(names, ", "), " hash to slots ", absl::StrJoin(slots, ", "),
          " but the group \"", request.name, "\" to slot ", slot,
          ": a group and its members must share one slot; name them with one hash tag, e.g. "
          "\"{layer0}.q_proj\""));
    }
  }
  std::vector<GroupMemberState> members;
  members.reserve(request.members.size());
  for (size_t i = 0; i < request.members.size(); ++i) {
    absl::StatusOr<std::shared_ptr<Session>> session =
        store_.Find({std::string(tenant), request.members[i]});
    absl::StatusOr<GroupMemberState> state =
        session.ok() ? (*session)->GroupMember() : session.status();
    if (!state.ok()) {
      return absl::Status(state.status().code(), absl::StrCat("group.members[", i, "]: ",
                                                              state.status().message()));
    }
    members.push_back(*std::move(state));
  }
  for (const GroupMemberState& m : members) {
    if (!(m.spec == members.front().spec)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group.members: the resolved specs of \"", members.front().name, "\" and \"", m.name,
          "\" differ (", SpecDifference(members.front().spec, m.spec),
          "); a group's members share one spec"));
    }
  }
  QPARAMS_RETURN_IF_ERROR(CheckGroupShare(*request.share, members.front().spec));
  ScaleGroupInfo group{request.name, request.members, *request.share, request.fill_uncalibrated,
                       absl::Now()};
  QPARAMS_RETURN_IF_ERROR(groups_.Create(tenant, group));
  return group;
}

absl::StatusOr<ScaleGroupInfo> Engine::GetScaleGroup(absl::string_view tenant,
                                                     absl::string_view name) const {
  const SlotOwnership::ReadAdmission admission(ownership_, name);
  QPARAMS_RETURN_IF_ERROR(admission.CheckOwned());
  return groups_.Find(tenant, name);
}

absl::StatusOr<ScaleGroupPage> Engine::ListScaleGroups(absl::string_view tenant, int page_size,
                                                       absl::string_view page_token,
                                                       absl::string_view filter) const {
  const SlotOwnership::ReadAdmission admission(ownership_);
  QPARAMS_ASSIGN_OR_RETURN(const PageStart start,
                           StartPage(page_size, page_token, filter, CheckFilter));
  // Sharded, as ListSessions: groups restored on a replica that no longer owns their
  // slot stay out of sight.
  ScaleGroupStore::Page page =
      admission.map() == nullptr
          ? groups_.List(tenant, filter, start.after, start.limit)
          : groups_.List(tenant, filter, start.after, start.limit,
                         [&admission](absl::string_view name) { return admission.Owns(name); });
  ScaleGroupPage out;
  out.groups = std::move(page.groups);
  if (page.more) out.next_page_token = EncodePageToken(filter, out.groups.back().name);
  return out;
}

absl::Status Engine::DeleteScaleGroup(absl::string_view tenant, absl::string_view name) {
  const SlotOwnership::WriteAdmission admission(ownership_, name);
  QPARAMS_RETURN_IF_ERROR(admission.CheckWritable());
  return groups_.Erase(tenant, name);
}

absl::StatusOr<GroupResult> Engine::GetGroupQParams(absl::string_view tenant,
                                                    absl::string_view name) const {
  const SlotOwnership::ReadAdmission admission(ownership_, name);
  QPARAMS_RETURN_IF_ERROR(admission.CheckOwned());
  QPARAMS_ASSIGN_OR_RETURN(const ScaleGroupInfo group, groups_.Find(tenant, name));
  std::vector<GroupMemberState> members;
  members.reserve(group.members.size());
  for (const std::string& member : group.members) {
    absl::StatusOr<std::shared_ptr<Session>> session = store_.Find({std::string(tenant), member});
    absl::StatusOr<GroupMemberState> state =
        session.ok() ? (*session)->GroupMember() : session.status();
    if (!state.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("member \"", member, "\" of scale group \"", name,
                       "\" no longer exists (", state.status().message(),
                       "); delete the group, or create the session again"));
    }
    members.push_back(*std::move(state));
  }
  return ComputeGroupQParams(group.share, group.fill_uncalibrated, members);
}

}  // namespace qparams
