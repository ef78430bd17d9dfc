// Moving slots online, in the domain (domain/slot_moves.h, Engine's slot moves): the
// states' text, writes refused while a slot migrates (and a write in flight either
// applied before the copy reads the session or refused), the states persisted across
// a restart, imports that are idempotent and only into importing slots, and drops.

#include <atomic>
#include <cstdlib>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <dirent.h>
#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "core/status_macros.h"
#include "domain/engine.h"
#include "domain/recovery.h"
#include "domain/slot_moves.h"
#include "gtest/gtest.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

constexpr absl::StatusCode kFailed = absl::StatusCode::kFailedPrecondition;
constexpr absl::StatusCode kUnavailable = absl::StatusCode::kUnavailable;

constexpr char kMap[] = "0:127 r0\n128:255 r1\n";
constexpr char kMovedMap[] = "0:9 r0\n10:20 r1\n21:127 r0\n128:255 r1\n";

// A name of slot `slot`'s, found by trying names.
std::string NameInSlot(int slot, int nth = 0) {
  for (int i = 0;; ++i) {
    std::string name = absl::StrCat("move/s", i);
    if (SlotOf(name) == slot && nth-- == 0) return name;
  }
}

EngineOptions Options(const std::string& replica, const char* map, const std::string& dir = "") {
  EngineOptions options;
  options.replica_id = replica;
  options.slot_map = std::make_shared<const SlotMap>(*SlotMap::Parse(map));
  options.journal.data_dir = dir;
  options.journal.durability = Durability::kAlways;
  return options;
}

Observation Obs(uint32_t seed) {
  static thread_local std::deque<Tensor> keep;  // the observations view these
  keep.push_back(Vec(RandN(16, seed)));
  return Observation::FromTensor(keep.back().view());
}

// Every record of the engine's, as bytes, in order.
std::string State(const Engine& engine) {
  std::string out;
  for (const storage::v1::Record& record : EngineRecords::Of(engine)) {
    out += record.SerializeAsString();
  }
  return out;
}

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/qparams-slot-move-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() {
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d)) {
        if (e->d_name[0] != '.') unlink((path_ + "/" + e->d_name).c_str());
      }
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(SlotMoves, TextRoundTripsAndRefusesMalformedLines) {
  const std::vector<SlotMove> moves = {{10, 20, SlotMoveState::kMigrating, "r1"},
                                       {30, 30, SlotMoveState::kImporting, "r2"}};
  const std::string text = RenderSlotMoves(moves);
  ASSERT_OK_AND_ASSIGN(const std::vector<SlotMove> parsed, ParseSlotMoves(text));
  EXPECT_EQ(parsed, moves);
  for (const auto& [bad, rule] : std::vector<std::pair<std::string, std::string>>{
           {"migrating 10:20\n", "expected"},
           {"moving 10:20 r1\n", "migrating or importing"},
           {"migrating 20:10 r1\n", "LOW:HIGH"},
           {"importing 0:256 r1\n", "LOW:HIGH"},
           {"importing 0:2 r/1\n", "replica name"},
           {"importing 0:2 r1\nmigrating 2:3 r2\n", "slot 2 is given twice"},
       }) {
    const absl::StatusOr<std::vector<SlotMove>> refused = ParseSlotMoves(bad);
    EXPECT_CODE(refused, kInvalid);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), rule)) << refused.status();
  }
}

TEST(SlotMoves, StatesAreCheckedAgainstTheMap) {
  Engine unsharded;
  EXPECT_CODE(unsharded.SetSlotState(0, 1, SlotMoveState::kMigrating, "r1"), kFailed);
  Engine r0(Options("r0", kMap));
  EXPECT_CODE(r0.SetSlotState(20, 10, SlotMoveState::kMigrating, "r1"), kInvalid);
  EXPECT_CODE(r0.SetSlotState(0, 256, SlotMoveState::kMigrating, "r1"), kInvalid);
  EXPECT_CODE(r0.SetSlotState(0, 1, SlotMoveState::kMigrating, "r0"), kInvalid);
  EXPECT_CODE(r0.SetSlotState(0, 1, SlotMoveState::kMigrating, "bad/name"), kInvalid);
  // Only the owner migrates a slot, only another replica imports it.
  EXPECT_CODE(r0.SetSlotState(120, 130, SlotMoveState::kMigrating, "r1"), kFailed);
  EXPECT_CODE(r0.SetSlotState(127, 127, SlotMoveState::kImporting, "r1"), kFailed);
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));  // again: nothing changes
  // A slot in one move is in no other until it is stable again.
  const absl::Status busy = r0.SetSlotState(15, 25, SlotMoveState::kMigrating, "r2");
  EXPECT_CODE(busy, kFailed);
  EXPECT_TRUE(absl::StrContains(busy.message(), "slot 15 is migrating with r1")) << busy;
  EXPECT_EQ(r0.SlotMoves(), (std::vector<SlotMove>{{10, 20, SlotMoveState::kMigrating, "r1"}}));
  ASSERT_OK(r0.SetSlotState(10, 12, SlotMoveState::kStable, ""));
  EXPECT_EQ(r0.SlotMoves(), (std::vector<SlotMove>{{13, 20, SlotMoveState::kMigrating, "r1"}}));
  Engine r1(Options("r1", kMap));
  EXPECT_CODE(r1.SetSlotState(10, 20, SlotMoveState::kMigrating, "r0"), kFailed);
  ASSERT_OK(r1.SetSlotState(10, 20, SlotMoveState::kImporting, "r0"));
}

TEST(SlotMoves, WritesToAMigratingSlotAreRefusedAndReadsServed) {
  Engine r0(Options("r0", kMap));
  const std::string name = NameInSlot(15);
  const std::string other = NameInSlot(30);
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric);
  ASSERT_OK(r0.CreateSession("", name, "global_minmax", spec, {}));
  ASSERT_OK(r0.CreateSession("", other, "global_minmax", spec, {}));
  ASSERT_OK(r0.Observe("", name, Obs(1)).status);
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));
  const std::string before = State(r0);

  const ObserveOutcome refused = r0.Observe("", name, Obs(2));
  EXPECT_CODE(refused.status, kUnavailable);
  EXPECT_TRUE(absl::StrContains(refused.status.message(), "slot 15 is moving to r1; retry"))
      << refused.status;
  EXPECT_EQ(refused.result.observation_count, 1);
  EXPECT_CODE(r0.CreateSession("", NameInSlot(15, 1), "global_minmax", spec, {}), kUnavailable);
  EXPECT_CODE(r0.DeleteSession("", name), kUnavailable);
  EXPECT_CODE(r0.SetExportMode("", name, true), kUnavailable);
  EXPECT_CODE(r0.SetGranularity("", name, Granularity::PerTensor()), kUnavailable);
  EXPECT_CODE(r0.CreateScaleGroup("", {"{" + name + "}", {name}, GroupShare::kUnionRange, false}),
              kUnavailable);
  // The name's own refusals come first.
  EXPECT_CODE(r0.Observe("", "bad name", Obs(3)).status, kInvalid);
  EXPECT_CODE(r0.Observe("", NameInSlot(200), Obs(3)).status, kFailed);
  EXPECT_EQ(State(r0), before);
  // Reads are served; other slots take writes.
  ASSERT_OK_AND_ASSIGN(const SessionInfo info, r0.GetSession("", name));
  EXPECT_EQ(info.observation_count, 1);
  EXPECT_OK(r0.GetQParams("", name));
  EXPECT_OK(r0.Observe("", other, Obs(4)).status);
  // Stable again: writes go through.
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kStable, ""));
  EXPECT_OK(r0.Observe("", name, Obs(2)).status);
}

// Idle sessions of slots migrating (source) or importing (target) are not evicted:
// the copy on the target must be what the source holds; once stable, they are.
TEST(SlotMoves, EvictionSkipsSlotsBeingMoved) {
  EngineOptions r0_options = Options("r0", kMap), r1_options = Options("r1", kMap);
  r0_options.session_ttl = r1_options.session_ttl = absl::Hours(1);
  Engine r0(r0_options), r1(r1_options);
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric);
  const std::string moving = NameInSlot(15), idle = NameInSlot(30);
  ASSERT_OK(r0.CreateSession("", moving, "global_minmax", spec, {}));
  ASSERT_OK(r0.CreateSession("", idle, "global_minmax", spec, {}));
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));
  ASSERT_OK(r1.SetSlotState(10, 20, SlotMoveState::kImporting, "r0"));
  ASSERT_OK_AND_ASSIGN(SlotRecord record, r0.SessionRecord({"", moving}));
  ASSERT_OK(r1.Import({record}));
  ASSERT_EQ(r1.session_count(), 1);

  const absl::Time later = absl::Now() + absl::Hours(2);
  EXPECT_EQ(r0.EvictIdle(later), 1);
  EXPECT_EQ(r1.EvictIdle(later), 0);
  EXPECT_OK(r0.GetSession("", moving));
  EXPECT_CODE(r0.GetSession("", idle).status(), absl::StatusCode::kNotFound);
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kStable, ""));
  ASSERT_OK(r1.SetSlotState(10, 20, SlotMoveState::kStable, ""));
  EXPECT_EQ(r0.EvictIdle(later), 1);
  EXPECT_EQ(r1.EvictIdle(later), 1);
  EXPECT_CODE(r0.GetSession("", moving).status(), absl::StatusCode::kNotFound);
}

// Observations race the switch to MIGRATING: every one acknowledged is in the
// record read after SetSlotState returns, and every one after is refused.
TEST(SlotMoves, AWriteInFlightIsAppliedBeforeTheStateChangesOrRefused) {
  Engine r0(Options("r0", kMap));
  const std::string name = NameInSlot(15);
  ASSERT_OK(r0.CreateSession("", name, "global_minmax", MakeSpec("int8", QScheme::kAsymmetric), {}));
  std::atomic<int64_t> acknowledged{0};
  std::atomic<bool> refused{false};
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&, t] {
      for (uint32_t i = 0;; ++i) {
        const ObserveOutcome outcome = r0.Observe("", name, Obs(t * 100000 + i));
        if (outcome.status.ok()) {
          ++acknowledged;
        } else {
          EXPECT_CODE(outcome.status, kUnavailable);
          refused = true;
          return;
        }
      }
    });
  }
  while (acknowledged.load() < 200) std::this_thread::yield();
  ASSERT_OK(r0.SetSlotState(15, 15, SlotMoveState::kMigrating, "r1"));
  ASSERT_OK_AND_ASSIGN(const SlotRecord record, r0.SessionRecord({"", name}));
  for (std::thread& w : writers) w.join();
  EXPECT_TRUE(refused);
  storage::v1::Record parsed;
  ASSERT_TRUE(parsed.ParseFromString(record.bytes));
  EXPECT_EQ(parsed.put().observation_count(), acknowledged.load());
}

TEST(SlotMoves, StatesSurviveARestart) {
  TempDir dir;
  const std::string name = NameInSlot(15);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> r0, Engine::Open(Options("r0", kMap, dir.path())));
    ASSERT_OK(r0->CreateSession("", name, "global_minmax", MakeSpec("int8", QScheme::kSymmetric), {}));
    ASSERT_OK(r0->SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));
    ASSERT_OK(r0->SetSlotState(30, 30, SlotMoveState::kMigrating, "r2"));
  }
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> r0, Engine::Open(Options("r0", kMap, dir.path())));
    EXPECT_EQ(r0->SlotMoves(), (std::vector<SlotMove>{{10, 20, SlotMoveState::kMigrating, "r1"},
                                                      {30, 30, SlotMoveState::kMigrating, "r2"}}));
    EXPECT_CODE(r0->Observe("", name, Obs(1)).status, kUnavailable);
    ASSERT_OK(r0->SetSlotState(10, 30, SlotMoveState::kStable, ""));
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> r0, Engine::Open(Options("r0", kMap, dir.path())));
  EXPECT_TRUE(r0->SlotMoves().empty());
  EXPECT_OK(r0->Observe("", name, Obs(1)).status);
}

TEST(SlotMoves, AFileThatDoesNotParseStopsTheStart) {
  TempDir dir;
  { ASSERT_OK(Engine::Open(Options("r0", kMap, dir.path())).status()); }
  FILE* f = fopen((dir.path() + "/slot-moves").c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("migrating 10:x r1\n", f);
  fclose(f);
  const absl::StatusOr<std::unique_ptr<Engine>> refused =
      Engine::Open(Options("r0", kMap, dir.path()));
  EXPECT_CODE(refused, kFailed);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "slot-moves")) << refused.status();
}

// The copy of slots 10:20 from r0 into r1: only while r1 imports them and does not
// own them; again, it changes nothing; r1 restarted on the moved map serves them
// exactly as r0 had them, groups and tenants included.
TEST(SlotMoves, ImportIsIdempotentAndServedOnceOwned) {
  TempDir dir;
  Engine r0(Options("r0", kMap));
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric);
  std::vector<std::string> names;
  for (int slot : {10, 15, 20}) names.push_back(NameInSlot(slot));
  const std::string outside = NameInSlot(21);
  for (const char* tenant : {"", "team-a"}) {
    for (const std::string& name : names) {
      ASSERT_OK(r0.CreateSession(tenant, name, "global_minmax", spec, {}));
      ASSERT_OK(r0.Observe(tenant, name, Obs(name.size() + tenant[0])).status);
    }
  }
  ASSERT_OK(r0.CreateSession("", outside, "global_minmax", spec, {}));
  const std::string group = "{" + names[0] + "}";
  ASSERT_EQ(SlotOf(group), SlotOf(names[0]));
  ASSERT_OK(r0.CreateSession("", group + ".m", "global_minmax", spec, {}));
  ASSERT_OK(r0.CreateScaleGroup("", {group, {group + ".m"}, GroupShare::kUnionRange, false}));
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));

  auto copy = [&](Engine& into) -> absl::Status {
    QPARAMS_ASSIGN_OR_RETURN(std::vector<SlotRecord> records, r0.SlotGroupRecords(10, 20));
    QPARAMS_ASSIGN_OR_RETURN(const std::vector<SessionKey> keys, r0.SlotSessionKeys(10, 20));
    for (const SessionKey& key : keys) {
      QPARAMS_ASSIGN_OR_RETURN(SlotRecord record, r0.SessionRecord(key));
      records.push_back(std::move(record));
    }
    return into.Import(records).status();
  };
  auto record_of = [&](const std::string& name) { return *r0.SessionRecord({"", name}); };
  std::string imported;
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> r1, Engine::Open(Options("r1", kMap, dir.path())));
    const absl::Status not_importing = copy(*r1);
    EXPECT_CODE(not_importing, kFailed);
    EXPECT_TRUE(absl::StrContains(not_importing.message(), "is not importing")) << not_importing;
    ASSERT_OK(r1->SetSlotState(10, 20, SlotMoveState::kImporting, "r0"));
    ASSERT_OK(copy(*r1));
    imported = State(*r1);
    EXPECT_EQ(r1->session_count(), 7);
    EXPECT_EQ(r1->scale_group_count(), 1);
    ASSERT_OK(copy(*r1));
    EXPECT_EQ(State(*r1), imported);
    // Not owned yet: not served.
    EXPECT_CODE(r1->GetSession("", names[0]), kFailed);
    storage::v1::Record erase;
    erase.mutable_erase()->set_name(names[0]);
    const absl::Status wrong_kind =
        r1->Import({record_of(names[0]), {erase.SerializeAsString()}}).status();
    EXPECT_CODE(wrong_kind, kInvalid);
    EXPECT_TRUE(absl::StrContains(wrong_kind.message(), "records[1]: ")) << wrong_kind;
    EXPECT_EQ(State(*r1), imported);
  }
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> r1,
                       Engine::Open(Options("r1", kMovedMap, dir.path())));
  EXPECT_EQ(State(*r1), imported);
  EXPECT_EQ(r1->SlotMoves(), (std::vector<SlotMove>{{10, 20, SlotMoveState::kImporting, "r0"}}));
  for (const char* tenant : {"", "team-a"}) {
    for (const std::string& name : names) {
      ASSERT_OK_AND_ASSIGN(const SessionInfo moved, r1->GetSession(tenant, name));
      ASSERT_OK_AND_ASSIGN(const SessionInfo original, r0.GetSession(tenant, name));
      EXPECT_EQ(moved.observation_count, original.observation_count);
      EXPECT_EQ(moved.running_min, original.running_min);
      EXPECT_EQ(moved.running_max, original.running_max);
      EXPECT_EQ(moved.update_time, original.update_time);
    }
  }
  EXPECT_OK(r1->GetGroupQParams("", group));
  // Owned now: imports are refused, writes taken.
  ASSERT_OK_AND_ASSIGN(const SlotRecord record, r0.SessionRecord({"", names[0]}));
  const absl::Status owned = r1->Import({record}).status();
  EXPECT_CODE(owned, kFailed);
  EXPECT_TRUE(absl::StrContains(owned.message(), "owns already")) << owned;
  ASSERT_OK(r1->SetSlotState(10, 20, SlotMoveState::kStable, ""));
  EXPECT_OK(r1->Observe("", names[0], Obs(9)).status);
}

// The switch while serving (Engine::SetSlotMap): the target serves what it imported
// without a restart, and the source, still migrating, names the new owner.
TEST(SlotMoves, TheSwitchHandsTheSlotsOverWhileServing) {
  Engine r0(Options("r0", kMap));
  Engine r1(Options("r1", kMap));
  const std::string name = NameInSlot(15);
  ASSERT_OK(r0.CreateSession("", name, "global_minmax", MakeSpec("int8", QScheme::kAsymmetric), {}));
  ASSERT_OK(r0.Observe("", name, Obs(7)).status);
  ASSERT_OK(r1.SetSlotState(10, 20, SlotMoveState::kImporting, "r0"));
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kMigrating, "r1"));
  ASSERT_OK_AND_ASSIGN(const SlotRecord record, r0.SessionRecord({"", name}));
  ASSERT_OK(r1.Import({record}));
  const auto moved =
      std::make_shared<const SlotMap>(*SlotMap::Parse(absl::StrCat("# epoch 1\n", kMovedMap)));
  ASSERT_OK(r1.SetSlotMap(moved));
  ASSERT_OK_AND_ASSIGN(const SessionInfo served, r1.GetSession("", name));
  EXPECT_EQ(served.observation_count, 1);
  EXPECT_OK(r1.Observe("", name, Obs(8)).status);  // the target takes writes at once
  EXPECT_CODE(r1.Import({record}), kFailed);       // and imports no more
  EXPECT_CODE(r0.Observe("", name, Obs(9)).status, kUnavailable);  // frozen until its switch
  ASSERT_OK(r0.SetSlotMap(moved));
  EXPECT_CODE(r0.Observe("", name, Obs(9)).status, kFailed);  // names r1
  ASSERT_OK(r1.SetSlotState(10, 20, SlotMoveState::kStable, ""));
  ASSERT_OK(r0.SetSlotState(10, 20, SlotMoveState::kStable, ""));
  ASSERT_OK_AND_ASSIGN(const SlotDrop dropped, r0.DropSlots(10, 20));
  EXPECT_EQ(dropped.sessions, 1);
}

TEST(SlotMoves, DropRemovesOnlySlotsNotOwned) {
  Engine r0(Options("r0", kMovedMap));
  Engine r1(Options("r1", kMap));
  const std::string name = NameInSlot(15);
  const QuantSpec spec = MakeSpec("int8", QScheme::kAsymmetric);
  ASSERT_OK(r1.SetSlotState(10, 20, SlotMoveState::kImporting, "r0"));
  // r1 holds a copy (imported), r0 owns nothing of 10:20 under its map.
  Engine source(Options("r0", kMap));
  ASSERT_OK(source.CreateSession("team-a", name, "global_minmax", spec, {}));
  ASSERT_OK_AND_ASSIGN(const SlotRecord record, source.SessionRecord({"team-a", name}));
  ASSERT_OK(r1.Import({record}));
  EXPECT_CODE(source.DropSlots(10, 20), kFailed);  // its own: the live ones
  EXPECT_CODE(r1.DropSlots(100, 200), kFailed);
  ASSERT_OK_AND_ASSIGN(const SlotDrop dropped, r1.DropSlots(10, 20));
  EXPECT_EQ(dropped.sessions, 1);
  EXPECT_EQ(r1.session_count(), 0);
  ASSERT_OK_AND_ASSIGN(const SlotDrop none, r0.DropSlots(10, 20));
  EXPECT_EQ(none.sessions, 0);
}

}  // namespace
}  // namespace qparams::testing
