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
#include "storage/small_file.h"

namespace qparams {
namespace {

const QParamsCalculatorRegistry& Registry() { return QParamsCalculatorRegistry::Global(); }

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
  if (options.slot_map != nullptr) QPARAMS_RETURN_IF_ERROR(ChooseSlotMap(options));
  std::unique_ptr<Engine> engine(new Engine(std::move(options), std::move(owned)));
  engine->map_dir_ = engine->options_.journal.data_dir;
  QPARAMS_RETURN_IF_ERROR(engine->Recover(journal));
  QPARAMS_RETURN_IF_ERROR(engine->LoadSlotMoves());
  return engine;
}

absl::Status Engine::ChooseSlotMap(EngineOptions& options) {
  Env& env = *options.journal.env;
  const std::string& dir = options.journal.data_dir;
  const std::string path = absl::StrCat(dir, "/", kSlotMapFileName);
  absl::StatusOr<std::optional<std::string>> text = ReadSmallFile(env, dir, kSlotMapFileName);
  if (!text.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the persisted slot map: ", text.status().message()));
  }
  const SlotMap& given = *options.slot_map;
  if (text->has_value()) {
    absl::StatusOr<SlotMap> persisted = SlotMap::Parse(**text);
    if (!persisted.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          path, " (the slot map this replica last took): ", persisted.status().message(),
          "; remove it to start from --slot_map alone"));
    }
    if (persisted->epoch() > given.epoch()) {
      LogInfo(absl::StrCat("slot map: using epoch ", persisted->epoch(), " from ", path,
                           ", newer than the given map's epoch ", given.epoch()));
      options.slot_map = std::make_shared<const SlotMap>(*std::move(persisted));
      return absl::OkStatus();
    }
    if (*persisted == given) return absl::OkStatus();
    if (persisted->epoch() == given.epoch()) {
      LogWarning(absl::StrCat("slot map: the given map and ", path, " both have epoch ",
                              given.epoch(), " but differ (",
                              SlotMap::DescribeChange(*persisted, given),
                              "); using the given map: bump the epoch of every changed map"));
    }
  }
  absl::Status written = WriteSmallFile(env, dir, kSlotMapFileName, given.ToText());
  if (!written.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot persist the slot map: ", written.message()));
  }
  return absl::OkStatus();
}

std::shared_ptr<const SlotMap> Engine::slot_map() const {
  absl::ReaderMutexLock lock(&map_mu_);
  return slot_map_;
}

absl::Status Engine::SetSlotMap(std::shared_ptr<const SlotMap> map) {
  if (map == nullptr) return absl::InvalidArgumentError("slot map: none given");
  absl::MutexLock set_lock(&set_map_mu_);
  const std::shared_ptr<const SlotMap> current = slot_map();
  if (current == nullptr || options_.replica_id.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this server is not a replica (started without --replica_id and --slot_map), so it "
        "takes no slot map (epoch ",
        map->epoch(), "); start it with both to shard"));
  }
  if (map->epoch() < current->epoch()) {
    return absl::FailedPreconditionError(
        absl::StrCat("slot map epoch ", map->epoch(), " is older than replica ",
                     options_.replica_id, "'s epoch ", current->epoch(),
                     "; a new map needs an epoch above ", current->epoch()));
  }
  if (map->epoch() == current->epoch()) {
    if (map->SameOwners(*current)) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "slot map epoch ", map->epoch(), " is replica ", options_.replica_id,
        "'s epoch ", current->epoch(), " but gives other owners (",
        SlotMap::DescribeChange(*current, *map), "); a changed map needs an epoch above ",
        current->epoch()));
  }
  if (!map_dir_.empty()) {
    QPARAMS_RETURN_IF_ERROR(
        WriteSmallFile(*options_.journal.env, map_dir_, kSlotMapFileName, map->ToText()));
  }
  {
    absl::MutexLock lock(&map_mu_);
    slot_map_ = map;
  }
  LogInfo(absl::StrCat("slot map: epoch ", current->epoch(), " -> ", map->epoch(), ": ",
                       SlotMap::DescribeChange(*current, *map), "; replica ",
                       options_.replica_id, " owns ", map->SlotsOf(options_.replica_id),
                       " slot(s)"));
  return absl::OkStatus();
}

absl::Status Engine::Recover(Journal& journal) {
  const absl::Time start = absl::Now();
  bool skipped = false;
  QPARAMS_ASSIGN_OR_RETURN(
      const Recovery recovery,
      journal.Recover([this, &skipped](const storage::v1::Record& record) {
        if (std::optional<std::string> problem = Replay(record)) {
          LogError(*problem);
          skipped = true;
        }
      }));
  for (const std::string& problem : recovery.problems) LogError(problem);
  // Records that were skipped are dropped for good by a snapshot, not met again at
  // every start.
  QPARAMS_RETURN_IF_ERROR(
      journal.Start([this](const Journal::Emitter& emit) { return EmitRecords(emit); },
                    /*snapshot=*/skipped));
  LogInfo(
      absl::StrCat("restored ", session_count(), " session(s) and ", groups_.size(),
                   " scale group(s) from ", options_.journal.data_dir, " (", recovery.files_read,
                   " file(s), ", recovery.records, " record(s)) in ",
                   absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
                   "; durability ", DurabilityName(options_.journal.durability)));
  return absl::OkStatus();
}

Engine::Engine(EngineOptions options)
    : Engine(std::move(options), std::make_unique<NullSessionLog>()) {}

Engine::Engine(EngineOptions options, std::unique_ptr<SessionLog> log)
    : options_(std::move(options)),
      slot_map_(options_.slot_map),
      log_(std::move(log)),
      store_(options_.max_sessions, *log_),
      groups_(options_.max_scale_groups, *log_),
      step_timer_(std::make_unique<StepTimer>(
          [this](const SessionKey& key, int64_t step, absl::Duration timeout) {
            ExpireStep(key, step, timeout);
          })) {
  if (options_.session_ttl <= absl::ZeroDuration()) return;
  // Idle sessions are found within a tenth of the TTL (at most a minute) of it.
  const absl::Duration period = std::min(options_.session_ttl / 10, absl::Minutes(1));
  evictor_ = std::thread([this, period] {
    while (!stop_.WaitForNotificationWithTimeout(period)) {
      if (int evicted = EvictIdle(absl::Now()); evicted > 0) {
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
    absl::ReaderMutexLock map_lock(&map_mu_);
    const int slot = SlotOf(session->name());
    absl::ReaderMutexLock hold(&gates_[slot].mu);
    if (gates_[slot].state != SlotMoveState::kStable) continue;
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
  absl::ReaderMutexLock map_lock(&map_mu_);
  const SlotGate& gate = gates_[SlotOf(name)];
  absl::ReaderMutexLock hold(&gate.mu);
  QPARAMS_RETURN_IF_ERROR(CheckWritable(name, gate));
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

absl::Status Engine::CheckAddressedTo(absl::string_view replica) const {
  if (replica == options_.replica_id && !replica.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the call is addressed to replica \"", replica, "\" (x-qparams-replica), but this is ",
      options_.replica_id.empty() ? "a server without sharding (no --replica_id)"
                                  : absl::StrCat("replica ", options_.replica_id),
      "; call through the balancer, or address this replica by its own name"));
}

bool Engine::Owns(absl::string_view name) const {
  return slot_map_ == nullptr || slot_map_->OwnerOfSession(name) == options_.replica_id;
}

absl::Status Engine::CheckOwned(absl::string_view name) const {
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(name));
  if (slot_map_ == nullptr) return absl::OkStatus();
  const int slot = SlotOf(name);
  const std::string& owner = slot_map_->OwnerOf(slot);
  if (owner == options_.replica_id) return absl::OkStatus();
  absl::Status refusal = absl::FailedPreconditionError(
      absl::StrCat("session ", name, " belongs to replica ", owner, " (slot ", slot,
                   "), not to this replica ", options_.replica_id,
                   "; send it there (the x-qparams-session header routes it through the "
                   "balancer)"));
  refusal.SetPayload(kOwnerPayload, absl::Cord(owner));
  return refusal;
}

absl::StatusOr<std::shared_ptr<Session>> Engine::Find(absl::string_view tenant,
                                                      absl::string_view name) const {
  QPARAMS_RETURN_IF_ERROR(CheckOwned(name));
  return store_.Find({std::string(tenant), std::string(name)});
}

absl::StatusOr<SessionInfo> Engine::GetSession(absl::string_view tenant,
                                               absl::string_view name) const {
  absl::ReaderMutexLock map_lock(&map_mu_);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(tenant, name);
  if (!session.ok()) return session.status();
  return (*session)->Info();
}

absl::Status Engine::DeleteSession(absl::string_view tenant, absl::string_view name) {
  absl::ReaderMutexLock map_lock(&map_mu_);
  const SlotGate& gate = gates_[SlotOf(name)];
  absl::ReaderMutexLock hold(&gate.mu);
  QPARAMS_RETURN_IF_ERROR(CheckWritable(name, gate));
  return store_.Erase({std::string(tenant), std::string(name)});
}

absl::StatusOr<SessionPage> Engine::ListSessions(absl::string_view tenant, int page_size,
                                                 absl::string_view page_token,
                                                 absl::string_view filter) const {
  absl::ReaderMutexLock map_lock(&map_mu_);
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size is ", page_size, "; it must be >= 0 (0 means ", kDefaultPageSize, ")"));
  }
  if (!filter.empty()) {
    QPARAMS_RETURN_IF_ERROR(ValidateSessionName(filter, "filter"));
  }
  absl::StatusOr<std::string> after = DecodePageToken(page_token, filter);
  if (!after.ok()) return after.status();
  const int limit = page_size == 0 ? kDefaultPageSize : std::min(page_size, kMaxPageSize);
  SessionStore::Page page =
      slot_map_ == nullptr
          ? store_.List(tenant, filter, *after, limit)
          : store_.List(tenant, filter, *after, limit,
                        [map = slot_map_.get(), &replica = options_.replica_id](absl::string_view name) {
                          return map->OwnerOfSession(name) == replica;
                        });
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
  absl::ReaderMutexLock map_lock(&map_mu_);
  const SlotGate& gate = gates_[SlotOf(name)];
  absl::ReaderMutexLock hold(&gate.mu);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(tenant, name);
  absl::Status status = x.status();
  if (status.ok() && key) status = ValidateObserveKey(*key);
  if (status.ok()) status = session.status();
  if (status.ok()) status = CheckWritable(name, gate);
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
  absl::ReaderMutexLock map_lock(&map_mu_);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(tenant, name);
  if (!session.ok()) return session.status();
  return (*session)->GetQParams();
}

absl::StatusOr<Histogram> Engine::GetHistogram(absl::string_view tenant,
                                               absl::string_view name) const {
  absl::ReaderMutexLock map_lock(&map_mu_);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(tenant, name);
  if (!session.ok()) return session.status();
  return (*session)->GetHistogram();
}

absl::StatusOr<SessionInfo> Engine::SetExportMode(absl::string_view tenant,
                                                  absl::string_view name, bool enabled) {
  absl::ReaderMutexLock map_lock(&map_mu_);
  const SlotGate& gate = gates_[SlotOf(name)];
  absl::ReaderMutexLock hold(&gate.mu);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(tenant, name);
  if (!session.ok()) return session.status();
  QPARAMS_RETURN_IF_ERROR(CheckWritable(name, gate));
  QPARAMS_RETURN_IF_ERROR((*session)->SetExportMode(enabled));
  return (*session)->Info();
}

absl::StatusOr<SessionInfo> Engine::SetGranularity(
    absl::string_view tenant, absl::string_view name,
    const std::optional<Granularity>& granularity) {
  absl::ReaderMutexLock map_lock(&map_mu_);
  if (!granularity.has_value()) {
    return absl::InvalidArgumentError(
        "granularity is unset; set per_tensor, per_channel or per_block");
  }
  const SlotGate& gate = gates_[SlotOf(name)];
  absl::ReaderMutexLock hold(&gate.mu);
  absl::StatusOr<std::shared_ptr<Session>> session = Find(tenant, name);
  if (!session.ok()) return session.status();
  QPARAMS_RETURN_IF_ERROR(CheckWritable(name, gate));
  QPARAMS_RETURN_IF_ERROR((*session)->SetGranularity(*granularity));
  return (*session)->Info();
}

// ---- Records ----

absl::Status Engine::EmitRecords(const Journal::Emitter& emit) const {
  QPARAMS_RETURN_IF_ERROR(store_.EmitRecords(emit));
  return groups_.EmitRecords(emit);
}

std::vector<storage::v1::Record> Engine::Records() const {
  std::vector<storage::v1::Record> records;
  EmitRecords([&](const storage::v1::Record& record) {
    records.push_back(record);
    return absl::OkStatus();
  }).IgnoreError();  // the emitter never fails
  return records;
}

std::optional<std::string> Engine::Replay(const storage::v1::Record& record) {
  switch (record.kind_case()) {
    case storage::v1::Record::kGroupCreate:
    case storage::v1::Record::kGroupDelete:
      return groups_.Replay(record);
    default:
      return store_.Replay(record);
  }
}

std::vector<std::string> Engine::Restore(const std::vector<storage::v1::Record>& records) {
  std::vector<std::string> problems;
  for (const storage::v1::Record& record : records) {
    if (std::optional<std::string> problem = Replay(record)) {
      problems.push_back(*std::move(problem));
    }
  }
  return problems;
}

// ---- Scale groups ----

absl::StatusOr<ScaleGroupInfo> Engine::CreateScaleGroup(absl::string_view tenant,
                                                        const ScaleGroupRequest& request) {
  absl::ReaderMutexLock map_lock(&map_mu_);
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(request.name, "group.name"));
  const SlotGate& gate = gates_[SlotOf(request.name)];
  absl::ReaderMutexLock hold(&gate.mu);
  QPARAMS_RETURN_IF_ERROR(CheckWritable(request.name, gate));
  QPARAMS_RETURN_IF_ERROR(ValidateGroupMembers(request.members));
  if (!request.share.has_value()) {
    return absl::InvalidArgumentError(
        "group.share is unset (SHARE_UNSPECIFIED) or not a known value; set GLOBAL_AMAX (NVFP4) "
        "or UNION_RANGE");
  }
  if (slot_map_ != nullptr) {
    const int slot = SlotOf(request.name);
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
  absl::ReaderMutexLock map_lock(&map_mu_);
  QPARAMS_RETURN_IF_ERROR(CheckOwned(name));
  return groups_.Find(tenant, name);
}

absl::StatusOr<ScaleGroupPage> Engine::ListScaleGroups(absl::string_view tenant, int page_size,
                                                       absl::string_view page_token,
                                                       absl::string_view filter) const {
  absl::ReaderMutexLock map_lock(&map_mu_);
  if (page_size < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page_size is ", page_size, "; it must be >= 0 (0 means ", kDefaultPageSize, ")"));
  }
  if (!filter.empty()) QPARAMS_RETURN_IF_ERROR(ValidateSessionName(filter, "filter"));
  absl::StatusOr<std::string> after = DecodePageToken(page_token, filter);
  if (!after.ok()) return after.status();
  const int limit = page_size == 0 ? kDefaultPageSize : std::min(page_size, kMaxPageSize);
  // Sharded, as ListSessions: groups restored on a replica that no longer owns their
  // slot stay out of sight.
  ScaleGroupStore::Page page =
      slot_map_ == nullptr
          ? groups_.List(tenant, filter, *after, limit)
          : groups_.List(tenant, filter, *after, limit,
                         [map = slot_map_.get(), &replica = options_.replica_id](absl::string_view name) {
                          return map->OwnerOfSession(name) == replica;
                        });
  ScaleGroupPage out;
  out.groups = std::move(page.groups);
  if (page.more) out.next_page_token = EncodePageToken(filter, out.groups.back().name);
  return out;
}

absl::Status Engine::DeleteScaleGroup(absl::string_view tenant, absl::string_view name) {
  absl::ReaderMutexLock map_lock(&map_mu_);
  const SlotGate& gate = gates_[SlotOf(name)];
  absl::ReaderMutexLock hold(&gate.mu);
  QPARAMS_RETURN_IF_ERROR(CheckWritable(name, gate));
  return groups_.Erase(tenant, name);
}

absl::StatusOr<GroupResult> Engine::GetGroupQParams(absl::string_view tenant,
                                                    absl::string_view name) const {
  absl::ReaderMutexLock map_lock(&map_mu_);
  QPARAMS_RETURN_IF_ERROR(CheckOwned(name));
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

// ---- Moving slots ----

absl::Status Engine::CheckWritable(absl::string_view name, const SlotGate& gate) const {
  QPARAMS_RETURN_IF_ERROR(CheckOwned(name));
  if (gate.state != SlotMoveState::kMigrating) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat("slot ", SlotOf(name), " is moving to ", gate.peer,
                                             "; retry (session ", name, ")"));
}

absl::Status Engine::CheckSlotRange(int low, int high) {
  if (low < 0 || high >= kSlotCount || low > high) {
    return absl::InvalidArgumentError(absl::StrCat("slots ", low, ":", high,
                                                   ": a range is LOW:HIGH with 0 <= LOW <= HIGH < ",
                                                   kSlotCount));
  }
  return absl::OkStatus();
}

std::vector<SlotMove> Engine::Runs(const SlotStates& moves) {
  std::vector<SlotMove> runs;
  for (int slot = 0; slot < kSlotCount; ++slot) {
    const auto& [state, peer] = moves[slot];
    if (state == SlotMoveState::kStable) continue;
    if (!runs.empty() && runs.back().high == slot - 1 && runs.back().state == state &&
        runs.back().peer == peer) {
      runs.back().high = slot;
    } else {
      runs.push_back({slot, slot, state, peer});
    }
  }
  return runs;
}

std::vector<SlotMove> Engine::SlotMoves() const {
  absl::MutexLock lock(&moves_mu_);
  return Runs(moves_);
}

absl::Status Engine::SetSlotState(int low, int high, SlotMoveState state,
                                  absl::string_view peer) {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  if (state == SlotMoveState::kStable) {
    peer = "";
  } else if (!SlotMap::ValidReplicaName(peer) || peer == options_.replica_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer \"", peer, "\": a move's peer is another replica's name (1 to 64 characters of "
        "[a-zA-Z0-9._-]), not this replica ", options_.replica_id));
  }
  absl::MutexLock lock(&moves_mu_);
  // The map cannot change until the states have: a move's checks and its switch
  // are ordered.
  absl::ReaderMutexLock map_lock(&map_mu_);
  if (slot_map_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no slot map (--replica_id, --slot_map): it owns every slot, and no "
        "slot can move out of it or into it");
  }
  for (int slot = low; slot <= high; ++slot) {
    const std::string& owner = slot_map_->OwnerOf(slot);
    if (state == SlotMoveState::kMigrating && owner != options_.replica_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("slot ", slot, " belongs to replica ", owner, ", not to this replica ",
                       options_.replica_id, "; only a slot's owner migrates it"));
    }
    if (state == SlotMoveState::kImporting && owner == options_.replica_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", slot, " belongs to this replica ", options_.replica_id, "; it cannot import it"));
    }
    const auto& [current, current_peer] = moves_[slot];
    if (state != SlotMoveState::kStable && current != SlotMoveState::kStable &&
        (current != state || current_peer != peer)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", slot, " is ", SlotMoveStateName(current), " with ", current_peer,
          "; finish or abort that move first"));
    }
  }
  SlotStates moves = moves_;
  for (int slot = low; slot <= high; ++slot) moves[slot] = {state, std::string(peer)};
  if (moves == moves_) return absl::OkStatus();
  // Writes in flight on the slots finish first; later ones see the new state.
  std::vector<std::unique_ptr<absl::MutexLock>> held;
  held.reserve(high - low + 1);
  for (int slot = low; slot <= high; ++slot) {
    held.push_back(std::make_unique<absl::MutexLock>(&gates_[slot].mu));
  }
  if (log_->keeps_records()) {
    if (absl::Status written = WriteSmallFile(*options_.journal.env, options_.journal.data_dir,
                                              kSlotMovesFile, RenderSlotMoves(Runs(moves)));
        !written.ok()) {
      return absl::UnavailableError(
          absl::StrCat("the slot moves cannot be written (", written.message(), ")"));
    }
  }
  moves_ = std::move(moves);
  SetGates(low, high, state, peer);
  LogInfo(absl::StrCat("slots ", low, ":", high, " are ", SlotMoveStateName(state),
                       peer.empty() ? "" : absl::StrCat(" with ", peer)));
  return absl::OkStatus();
}

void Engine::SetGates(int low, int high, SlotMoveState state, absl::string_view peer) {
  for (int slot = low; slot <= high; ++slot) {
    gates_[slot].state = state;
    gates_[slot].peer = std::string(peer);
  }
}

absl::Status Engine::LoadSlotMoves() {
  const std::string& dir = options_.journal.data_dir;
  absl::StatusOr<std::optional<std::string>> text =
      ReadSmallFile(*options_.journal.env, dir, kSlotMovesFile);
  absl::StatusOr<std::vector<SlotMove>> moves =
      !text.ok() ? text.status()
                 : ParseSlotMoves(text->has_value() ? absl::string_view(**text) : "");
  if (!moves.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, "/", kSlotMovesFile, ": ", moves.status().message(),
        " (the slot moves this replica takes part in; fix or remove it, then resume or abort "
        "the move)"));
  }
  absl::MutexLock lock(&moves_mu_);
  for (const SlotMove& move : *moves) {
    for (int slot = move.low; slot <= move.high; ++slot) {
      moves_[slot] = {move.state, move.peer};
      absl::MutexLock gate(&gates_[slot].mu);
      gates_[slot].state = move.state;
      gates_[slot].peer = move.peer;
    }
    LogInfo(absl::StrCat("slots ", move.low, ":", move.high, " are ",
                         SlotMoveStateName(move.state), " with ", move.peer,
                         " (a move in progress: resume or abort it)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<SessionKey>> Engine::SlotSessionKeys(int low, int high) const {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  return store_.KeysWhere([low, high](absl::string_view name) {
    const int slot = SlotOf(name);
    return slot >= low && slot <= high;
  });
}

absl::StatusOr<std::vector<storage::v1::Record>> Engine::SlotGroupRecords(int low,
                                                                          int high) const {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  return groups_.RecordsWhere([low, high](absl::string_view name) {
    const int slot = SlotOf(name);
    return slot >= low && slot <= high;
  });
}

absl::StatusOr<storage::v1::Record> Engine::SessionRecord(const SessionKey& key) const {
  QPARAMS_ASSIGN_OR_RETURN(const std::shared_ptr<Session> session, store_.Find(key));
  storage::v1::Record record;
  *record.mutable_put() = session->Record();
  // Retired after the lookup: its record would bring a deleted session back.
  QPARAMS_RETURN_IF_ERROR(store_.Find(key).status());
  return record;
}

absl::Status Engine::Import(const std::vector<storage::v1::Record>& records) {
  uint64_t sequence = 0;
  absl::Status status;
  for (size_t i = 0; i < records.size() && status.ok(); ++i) {
    absl::StatusOr<uint64_t> imported = ImportOne(records[i]);
    if (imported.ok()) {
      sequence = std::max(sequence, *imported);
    } else {
      status = absl::Status(imported.status().code(),
                            absl::StrCat("records[", i, "]: ", imported.status().message()));
    }
  }
  const absl::Status synced = log_->Sync(sequence);
  return status.ok() ? synced : status;
}

absl::StatusOr<uint64_t> Engine::ImportOne(const storage::v1::Record& record) {
  std::string name;
  if (record.kind_case() == storage::v1::Record::kPut) {
    name = record.put().key().name();
  } else if (record.kind_case() == storage::v1::Record::kGroupCreate) {
    name = record.group_create().key().name();
  } else {
    return absl::InvalidArgumentError(
        "record: a move imports a session's state (put) or a scale group's creation "
        "(group_create), nothing else");
  }
  const int slot = SlotOf(name);
  absl::ReaderMutexLock map_lock(&map_mu_);
  const SlotGate& gate = gates_[slot];
  absl::ReaderMutexLock hold(&gate.mu);
  if (Owns(name) || gate.state != SlotMoveState::kImporting) {
    return absl::FailedPreconditionError(absl::StrCat(
        "\"", name, "\" is of slot ", slot, ", which this replica ", options_.replica_id,
        Owns(name) ? " owns already" : " is not importing",
        "; a move imports only into slots the target is importing (reshard marks them)"));
  }
  if (record.kind_case() == storage::v1::Record::kPut) return store_.Import(record.put());
  return groups_.Import(record.group_create());
}

absl::StatusOr<SlotDrop> Engine::DropSlots(int low, int high) {
  QPARAMS_RETURN_IF_ERROR(CheckSlotRange(low, high));
  // Held to the end: the slots do not become this replica's while it drops them.
  absl::ReaderMutexLock map_lock(&map_mu_);
  if (slot_map_ == nullptr) {
    return absl::FailedPreconditionError(
        "this server has no slot map: it owns every slot, so it drops none");
  }
  for (int slot = low; slot <= high; ++slot) {
    if (slot_map_->OwnerOf(slot) == options_.replica_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "slot ", slot, " belongs to this replica ", options_.replica_id,
          "; its sessions there are the live ones, and are not dropped"));
    }
  }
  SlotDrop dropped;
  QPARAMS_ASSIGN_OR_RETURN(const std::vector<storage::v1::Record> groups,
                           SlotGroupRecords(low, high));
  for (const storage::v1::Record& group : groups) {
    const absl::Status erased =
        groups_.Erase(group.group_create().key().tenant(), group.group_create().key().name());
    if (!erased.ok() && !absl::IsNotFound(erased)) return erased;
    if (erased.ok()) ++dropped.groups;
  }
  QPARAMS_ASSIGN_OR_RETURN(const std::vector<SessionKey> keys, SlotSessionKeys(low, high));
  QPARAMS_ASSIGN_OR_RETURN(dropped.sessions, store_.EraseAll(keys));
  return dropped;
}

}  // namespace qparams
