// Idempotency keys in the domain: the dedupe window's rules (common/dedupe_window.h)
// and a session applying a key at most once, also across a restart from its journal
// and from a snapshot of its records.

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/dedupe_window.h"
#include "domain/engine.h"
#include "domain/recovery.h"
#include "gtest/gtest.h"
#include "storage/session_codec.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

ObserveKey Key(uint64_t sequence, const std::string& client = "client-a") {
  return ObserveKey{client, sequence};
}

TEST(ObserveKeys, AreValidatedNamingTheFieldAndTheRule) {
  EXPECT_OK(ValidateObserveKey(Key(1)));
  EXPECT_OK(ValidateObserveKey(Key(7, std::string(64, 'x'))));
  for (const ObserveKey& bad : {Key(1, std::string(65, 'x')), Key(1, "has space"),
                                Key(1, "slash/")}) {
    absl::Status status = ValidateObserveKey(bad);
    EXPECT_CODE(status, kInvalid) << bad.client_id;
    EXPECT_TRUE(absl::StrContains(status.message(), "client_id")) << status;
  }
  EXPECT_TRUE(absl::StrContains(ValidateObserveKey(Key(1, "")).message(),
                                "without a client_id"));
  EXPECT_TRUE(absl::StrContains(ValidateObserveKey(Key(1, "a b")).message(), "client_id"));
  EXPECT_TRUE(absl::StrContains(ValidateObserveKey(Key(0)).message(), "sequence must be >= 1"));
}

TEST(DedupeWindow, AnswersAnAppliedKeyWithItsCount) {
  DedupeWindow window;
  ASSERT_OK_AND_ASSIGN(std::optional<int64_t> first, window.Check(Key(1)));
  EXPECT_FALSE(first.has_value());
  window.Record(Key(1), 10);
  window.Record(Key(2), 11);
  ASSERT_OK_AND_ASSIGN(std::optional<int64_t> again, window.Check(Key(1)));
  EXPECT_EQ(again, 10);
  ASSERT_OK_AND_ASSIGN(again, window.Check(Key(2)));
  EXPECT_EQ(again, 11);
  // Another client's sequence 1 is its own.
  ASSERT_OK_AND_ASSIGN(again, window.Check(Key(1, "client-b")));
  EXPECT_FALSE(again.has_value());
}

TEST(DedupeWindow, TakesSequencesOutOfOrderWithinTheWindowAndRefusesOlderOnes) {
  DedupeWindow window;
  window.Record(Key(5), 1);
  // 3 and 4 were in flight concurrently: never applied, so they apply.
  ASSERT_OK_AND_ASSIGN(std::optional<int64_t> seen, window.Check(Key(3)));
  EXPECT_FALSE(seen.has_value());
  window.Record(Key(3), 2);
  for (uint64_t s = 6; s < 6 + DedupeWindow::kSequencesPerClient; ++s) window.Record(Key(s), s);
  // The window now holds 6..21: 5 and 3 are forgotten, 4 is older than all it holds.
  ASSERT_EQ(window.clients().size(), 1u);
  EXPECT_EQ(window.clients()[0].applied.size(), size_t{DedupeWindow::kSequencesPerClient});
  EXPECT_EQ(window.clients()[0].applied.front().sequence, 6u);
  for (uint64_t old : {3, 4, 5}) {
    absl::StatusOr<std::optional<int64_t>> refused = window.Check(Key(old));
    EXPECT_CODE(refused, kPrecondition);
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "older than the session's dedupe"))
        << refused.status();
  }
  ASSERT_OK_AND_ASSIGN(seen, window.Check(Key(21)));
  EXPECT_EQ(seen, 21);
  ASSERT_OK_AND_ASSIGN(seen, window.Check(Key(100)));
  EXPECT_FALSE(seen.has_value());
}

TEST(DedupeWindow, ForgetsTheLeastRecentlyAppliedClientBeyondTheLimit) {
  DedupeWindow window;
  for (int c = 0; c <= DedupeWindow::kMaxClients; ++c) {
    window.Record(Key(1, absl::StrCat("c", c)), c);
    if (c == 1) window.Record(Key(2, "c0"), 100);  // c0 becomes the most recent
  }
  ASSERT_EQ(window.clients().size(), size_t{DedupeWindow::kMaxClients});
  // c1 went, the least recent; c0, touched after it, is now the least recent.
  EXPECT_EQ(window.clients().front().id, "c0");
  EXPECT_EQ(window.clients().back().id, absl::StrCat("c", DedupeWindow::kMaxClients));
  ASSERT_OK_AND_ASSIGN(std::optional<int64_t> c0, window.Check(Key(2, "c0")));
  EXPECT_EQ(c0, 100);
  ASSERT_OK_AND_ASSIGN(std::optional<int64_t> c1, window.Check(Key(1, "c1")));
  EXPECT_FALSE(c1.has_value());  // forgotten: the guarantee's limit
}

TEST(DedupeWindow, FromClientsRefusesWhatBreaksItsRules) {
  EXPECT_OK(DedupeWindow::FromClients({{"a", {{1, 1}, {3, 2}}}}));
  EXPECT_CODE(DedupeWindow::FromClients({{"a", {{3, 1}, {3, 2}}}}), kInvalid);
  EXPECT_CODE(DedupeWindow::FromClients({{"a", {{0, 1}}}}), kInvalid);
  EXPECT_CODE(DedupeWindow::FromClients({{"a", {}}}), kInvalid);
  EXPECT_CODE(DedupeWindow::FromClients({{"a b", {{1, 1}}}}), kInvalid);
  EXPECT_CODE(DedupeWindow::FromClients({{"a", {{1, 1}}}, {"a", {{2, 1}}}}), kInvalid);
  EXPECT_CODE(DedupeWindow::FromClients({{"a", {{1, -1}}}}), kInvalid);
}

// A moving_average session: not idempotent, so a second application shows.
class EngineDedupe : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/qparams-dedupe-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    engine_.reset();
    ASSERT_EQ(std::system(("rm -rf " + dir_).c_str()), 0);
  }

  void Open() {
    engine_.reset();
    EngineOptions options;
    options.journal.data_dir = dir_;
    options.journal.durability = Durability::kAlways;
    ASSERT_OK_AND_ASSIGN(engine_, Engine::Open(std::move(options)));
  }

  void CreateSession(Engine& engine) {
    ASSERT_OK(engine.CreateSession("t", "ma", "moving_average",
                                   MakeSpec("int8", QScheme::kAsymmetric), {}));
  }

  ObserveOutcome Observe(Engine& engine, double scale, std::optional<ObserveKey> key) {
    const Tensor x = Vec({-1.0 * scale, 2.0 * scale});
    return engine.Observe("t", "ma", Obs(x), false, key);
  }

  std::string dir_;
  std::unique_ptr<Engine> engine_;
};

TEST_F(EngineDedupe, ARetriedKeyIsAppliedOnceAndAnsweredWithTheOriginalCount) {
  Engine engine;
  CreateSession(engine);
  ObserveOutcome first = Observe(engine, 1, Key(1));
  ASSERT_OK(first.status);
  EXPECT_EQ(first.result.observation_count, 1);
  EXPECT_FALSE(first.result.duplicate);
  ASSERT_OK(Observe(engine, 3, Key(2)).status);
  const SessionInfo before = *engine.GetSession("t", "ma");

  ObserveOutcome retry = Observe(engine, 1, Key(1));
  ASSERT_OK(retry.status);
  EXPECT_TRUE(retry.result.duplicate);
  EXPECT_EQ(retry.result.observation_count, 1);  // the original's
  // The session's current qparams, and nothing applied.
  EXPECT_EQ(retry.result.qparams.scale, before.qparams.scale);
  const SessionInfo after = *engine.GetSession("t", "ma");
  EXPECT_EQ(after.observation_count, 2);
  EXPECT_EQ(after.running_min, before.running_min);
  EXPECT_EQ(after.running_max, before.running_max);

  // Unkeyed observations apply every time, as before.
  ASSERT_OK(Observe(engine, 1, std::nullopt).status);
  ASSERT_OK(Observe(engine, 1, std::nullopt).status);
  EXPECT_EQ(engine.GetSession("t", "ma")->observation_count, 4);
}

TEST_F(EngineDedupe, ABadKeyOrAnOldSequenceIsRefusedAndChangesNothing) {
  Engine engine;
  CreateSession(engine);
  ObserveOutcome bad = Observe(engine, 1, Key(0));
  EXPECT_CODE(bad.status, kInvalid);
  EXPECT_TRUE(absl::StrContains(bad.status.message(), "sequence")) << bad.status;
  for (uint64_t s = 1; s <= DedupeWindow::kSequencesPerClient + 1; ++s) {
    ASSERT_OK(Observe(engine, 1, Key(s)).status);
  }
  const SessionInfo before = *engine.GetSession("t", "ma");
  ObserveOutcome old = Observe(engine, 5, Key(1));
  EXPECT_CODE(old.status, kPrecondition);
  EXPECT_EQ(old.result.observation_count, before.observation_count);
  EXPECT_EQ(engine.GetSession("t", "ma")->running_max, before.running_max);
}

TEST_F(EngineDedupe, AFailedObservationIsNotRememberedSoItsRetryIsEvaluatedAgain) {
  Engine engine;
  CreateSession(engine);
  ASSERT_OK(Observe(engine, 1, Key(1)).status);
  // A float64 tensor after a float32 one: refused (the session's input dtype).
  const Tensor wrong = Vec({1.0, 2.0}, DType::kFloat64);
  ObserveOutcome failed = engine.Observe("t", "ma", Obs(wrong), false, Key(2));
  ASSERT_FALSE(failed.status.ok());
  ObserveOutcome again = engine.Observe("t", "ma", Obs(wrong), false, Key(2));
  EXPECT_EQ(again.status, failed.status);
  EXPECT_FALSE(again.result.duplicate);
  EXPECT_EQ(engine.GetSession("t", "ma")->observation_count, 1);
}

TEST_F(EngineDedupe, TheWindowSurvivesARestartFromTheJournal) {
  Open();
  CreateSession(*engine_);
  ASSERT_OK(Observe(*engine_, 1, Key(1)).status);
  ASSERT_OK(Observe(*engine_, 2, Key(2, "client-b")).status);
  const SessionInfo before = *engine_->GetSession("t", "ma");
  Open();  // the journal replayed
  ObserveOutcome retry = Observe(*engine_, 1, Key(1));
  ASSERT_OK(retry.status);
  EXPECT_TRUE(retry.result.duplicate);
  EXPECT_EQ(retry.result.observation_count, 1);
  retry = Observe(*engine_, 2, Key(2, "client-b"));
  EXPECT_TRUE(retry.result.duplicate);
  EXPECT_EQ(retry.result.observation_count, 2);
  const SessionInfo after = *engine_->GetSession("t", "ma");
  EXPECT_EQ(after.observation_count, before.observation_count);
  EXPECT_EQ(after.running_max, before.running_max);
  ObserveOutcome next = Observe(*engine_, 1, Key(2));
  ASSERT_OK(next.status);
  EXPECT_FALSE(next.result.duplicate);
  EXPECT_EQ(next.result.observation_count, 3);
}

TEST_F(EngineDedupe, TheWindowTravelsInTheSessionsRecordsAndASnapshot) {
  Engine engine;
  CreateSession(engine);
  ASSERT_OK(Observe(engine, 1, Key(1)).status);
  ASSERT_OK(Observe(engine, 1, std::nullopt).status);
  ASSERT_OK(Observe(engine, 1, Key(2)).status);
  const std::vector<storage::v1::Record> records = EngineRecords::Of(engine);
  ASSERT_EQ(records.size(), 1u);
  ASSERT_EQ(records[0].put().observe_clients_size(), 1);
  EXPECT_EQ(records[0].put().observe_clients(0).sequences_size(), 2);

  Engine restored;  // as a snapshot or a moved session's state restores
  EXPECT_TRUE(EngineRecords::Restore(restored, records).empty());
  ObserveOutcome retry = Observe(restored, 1, Key(2));
  ASSERT_OK(retry.status);
  EXPECT_TRUE(retry.result.duplicate);
  EXPECT_EQ(retry.result.observation_count, 3);

  // A record written before keys existed restores with an empty window.
  storage::v1::Record old = records[0];
  old.mutable_put()->clear_observe_clients();
  Engine older;
  EXPECT_TRUE(EngineRecords::Restore(older, {old}).empty());
  ObserveOutcome applied = Observe(older, 1, Key(2));
  ASSERT_OK(applied.status);
  EXPECT_FALSE(applied.result.duplicate);

  // A record whose window breaks the rules does not restore.
  storage::v1::Record broken = records[0];
  broken.mutable_put()->mutable_observe_clients(0)->add_sequences(1);
  EXPECT_CODE(DecodeSession(broken.put()), kInvalid);
}

}  // namespace
}  // namespace qparams::testing
