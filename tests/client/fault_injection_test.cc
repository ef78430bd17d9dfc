// Storage faults proven harmless (docs/operations.md, "When storage fails"), through
// FaultInjectionEnv: a failing or short append (of a session's record or a scale
// group's), a failing fsync, a failing rename or directory sync of a snapshot, and a
// crash between any two steps of a compaction.
// The call that meets the fault is refused with UNAVAILABLE naming the operation,
// its mutation is seen by no later read, reads go on, health says so, and a restart
// restores exactly the acknowledged state.

#include <stdlib.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "metrics/metrics_http.h"
#include "qparams/client.h"
#include "storage/journal.h"
#include "tests/client/fault_injection_env.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using Op = FaultInjectionEnv::Op;
using grpc::health::v1::HealthCheckResponse;

std::string TempDir() {
  char pattern[] = "/tmp/qparams-faults-XXXXXX";
  return mkdtemp(pattern) != nullptr ? pattern : "";
}

// ---- Through the server: the rule as clients see it ----

class StorageFaultTest : public ::testing::TestWithParam<Durability> {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    Stop();
    std::filesystem::remove_all(dir_);
  }

  // (Re)starts the server on the data directory through `env`.
  bool Start(Env* env) {
    Stop();
    ServerOptions options;
    options.data_dir = dir_;
    options.durability = GetParam();
    options.env = env;
    options.storage_probe_max_age = absl::ZeroDuration();  // every health check probes
    server_ = TestServer::Start(options);
    if (server_ == nullptr) return false;
    // No retries: the refusals are what these tests check, and a client would otherwise
    // send each refused mutation again for retry_total (30 s) before giving up.
    ClientOptions no_retry;
    no_retry.retry_total = absl::ZeroDuration();
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(server_->address(), no_retry);
    if (!client.ok()) return false;
    client_ = *std::move(client);
    return true;
  }
  void Stop() {
    client_.reset();
    server_.reset();
  }

  // Every session with every field (times included), as bytes.
  std::string State() {
    absl::StatusOr<v1::ListSessionsResponse> all = client_->ListSessions(1000, "", "");
    return all.ok() ? all->SerializeAsString() : all.status().ToString();
  }

  absl::Status Observe(const std::string& name, std::vector<double> values) {
    return client_->Observe(name, F32({static_cast<int64_t>(values.size())}, values).view())
        .status();
  }

  // Two sessions with some history: the acknowledged state the faults must keep.
  void Populate() {
    v1::CreateSessionRequest create;
    create.set_name("a");
    create.set_calculator("global_minmax");
    ASSERT_OK(client_->CreateSession(create));
    create.set_name("b");
    create.set_calculator("moving_average");
    ASSERT_OK(client_->CreateSession(create));
    ASSERT_OK(Observe("a", {1, -2, 3}));
    ASSERT_OK(Observe("b", {0.5, 4}));
    ASSERT_OK(Observe("b", {-1, 2}));
  }

  // The rule after a fault: `refused` was UNAVAILABLE naming `operation`, the state is
  // the acknowledged one, reads go on, mutations are refused, health says so.
  void ExpectRefusedAndUnseen(const absl::Status& refused, absl::string_view operation,
                              const std::string& acknowledged) {
    EXPECT_CODE(refused, absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StrContains(refused.message(), operation)) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "(injected)")) << refused;
    EXPECT_EQ(State(), acknowledged);
    EXPECT_CODE(Observe("a", {7}), absl::StatusCode::kUnavailable);
    v1::CreateSessionRequest create;
    create.set_name("c");
    EXPECT_CODE(client_->CreateSession(create), absl::StatusCode::kUnavailable);
    EXPECT_EQ(State(), acknowledged);
    EXPECT_OK(client_->GetQParams("a"));
    ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus storage,
                         client_->Health(QParamsServer::kStorageHealthName));
    EXPECT_EQ(storage, HealthCheckResponse::NOT_SERVING);
    ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus service,
                         client_->Health(QParamsServer::kServiceName));
    EXPECT_EQ(service, HealthCheckResponse::SERVING);  // reads are served
  }

  std::string dir_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_P(StorageFaultTest, AFailedOrShortAppendIsRefusedAndNeverSeen) {
  for (bool partial : {false, true}) {
    SCOPED_TRACE(partial ? "short write" : "failed write");
    std::filesystem::remove_all(dir_);
    FaultInjectionEnv env;
    ASSERT_TRUE(Start(&env));
    Populate();
    const std::string acknowledged = State();
    ASSERT_OK_AND_ASSIGN(HealthCheckResponse::ServingStatus healthy,
                         client_->Health(QParamsServer::kStorageHealthName));
    EXPECT_EQ(healthy, HealthCheckResponse::SERVING);

    env.FailNext(Op::kAppend, 1, partial);
    ExpectRefusedAndUnseen(Observe("b", {9, 9}), "write", acknowledged);

    // The process restarts (the page cache survives): a short frame is set aside.
    ASSERT_TRUE(Start(Env::Posix()));
    EXPECT_EQ(State(), acknowledged);
    EXPECT_OK(Observe("b", {9, 9}));  // storage works again after the restart
  }
}

// A scale group's creation or deletion that meets a failed write: UNAVAILABLE, the
// groups as acknowledged (in memory and after the restart), every later group
// mutation refused too.
TEST_P(StorageFaultTest, AFailedAppendOfAScaleGroupChangesNothing) {
  for (bool create : {true, false}) {
    SCOPED_TRACE(create ? "CreateScaleGroup" : "DeleteScaleGroup");
    std::filesystem::remove_all(dir_);
    FaultInjectionEnv env;
    ASSERT_TRUE(Start(&env));
    Populate();
    std::unique_ptr<v1::QParamsService::Stub> stub = server_->NewStub();
    ASSERT_TRUE(
        CreateScaleGroup(*stub, ScaleGroupOf("kept", {"b", "a"}, v1::ScaleGroup::UNION_RANGE))
            .ok());
    const std::vector<std::string> names = {"kept", "new"};
    const std::string acknowledged = ScaleGroupState(*stub, names);
    ASSERT_TRUE(absl::StrContains(acknowledged, "kept"));

    env.FailNext(Op::kAppend);
    const absl::Status refused =
        FromGrpc(create ? CreateScaleGroup(
                              *stub, ScaleGroupOf("new", {"a", "b"}, v1::ScaleGroup::UNION_RANGE))
                        : DeleteScaleGroup(*stub, "kept"));
    EXPECT_CODE(refused, absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StrContains(refused.message(), "write")) << refused;
    EXPECT_TRUE(absl::StrContains(refused.message(), "(injected)")) << refused;
    EXPECT_EQ(ScaleGroupState(*stub, names), acknowledged);
    EXPECT_EQ(
        FromGrpc(CreateScaleGroup(*stub, ScaleGroupOf("new", {"a"}, v1::ScaleGroup::UNION_RANGE)))
            .code(),
        absl::StatusCode::kUnavailable);
    EXPECT_EQ(FromGrpc(DeleteScaleGroup(*stub, "kept")).code(), absl::StatusCode::kUnavailable);
    EXPECT_EQ(ScaleGroupState(*stub, names), acknowledged);

    stub.reset();
    ASSERT_TRUE(Start(Env::Posix()));
    stub = server_->NewStub();
    EXPECT_EQ(ScaleGroupState(*stub, names), acknowledged);
    EXPECT_TRUE(DeleteScaleGroup(*stub, "kept").ok());  // storage works again after the restart
  }
}

TEST_P(StorageFaultTest, AFailedFsyncIsRefusedAndNeverSeen) {
  FaultInjectionEnv env;
  ASSERT_TRUE(Start(&env));
  Populate();
  // Under kBatched the flusher meets the failure; make every state durable first.
  Stop();
  ASSERT_TRUE(Start(&env));
  const std::string acknowledged = State();
  env.FailNext(Op::kSync);
  if (GetParam() == Durability::kAlways) {
    ExpectRefusedAndUnseen(Observe("b", {9, 9}), "fsync", acknowledged);
  } else {
    // Batched: the observation is acknowledged once written; the flusher's fsync
    // fails within the flush interval and every later mutation is refused.
    ASSERT_OK(Observe("b", {9, 9}));
    absl::Status refused;
    while ((refused = Observe("a", {1})).ok()) {
    }
    EXPECT_CODE(refused, absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StrContains(refused.message(), "fsync")) << refused;
  }
  // After a failed fsync nothing unsynced can be trusted: a power loss drops it.
  Stop();
  env.DropUnsyncedData();
  ASSERT_TRUE(Start(Env::Posix()));
  EXPECT_EQ(State(), acknowledged);
}

TEST_P(StorageFaultTest, AStartThatFailsKeepsEverythingForTheNextStart) {
  FaultInjectionEnv env;
  ASSERT_TRUE(Start(&env));
  Populate();
  const std::string acknowledged = State();
  Stop();
  // Each start rotates to a new journal file: its creation, its directory entry.
  for (auto [op, nth] : {std::pair{Op::kNewFile, 1}, std::pair{Op::kSyncDir, 1}}) {
    SCOPED_TRACE(absl::StrCat("op ", static_cast<int>(op), " call ", nth));
    env.FailNext(op, nth);
    EXPECT_FALSE(Start(&env));
    env.DropUnsyncedData();
    ASSERT_TRUE(Start(Env::Posix()));
    EXPECT_EQ(State(), acknowledged);
    Stop();
  }
}

// A real full file system: a small tmpfs, where the machine lets this process mount
// one (root, outside a restricted container); skipped otherwise.
TEST_P(StorageFaultTest, AFullFileSystemRefusesTheMutationThatDoesNotFit) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=256k") != 0) {
    GTEST_SKIP() << "cannot mount a tmpfs on " << dir_ << ": " << strerror(errno);
  }
  struct Unmount {
    std::string dir;
    ~Unmount() { umount(dir.c_str()); }
  } unmount{dir_};
  ASSERT_TRUE(Start(Env::Posix()));
  Populate();
  v1::CreateSessionRequest create;
  create.set_name("wide");
  create.set_calculator("global_minmax");
  create.mutable_spec()->mutable_granularity()->mutable_per_channel()->set_axis(0);
  ASSERT_OK(client_->CreateSession(create));
  std::vector<double> values(4096);
  std::string acknowledged = State();
  absl::Status refused;
  for (int i = 0; i < 1000 && refused.ok(); ++i) {
    for (size_t k = 0; k < values.size(); ++k) values[k] = (i + 1) * (k % 2 ? 1.0 : -1.0);
    refused = Observe("wide", values);
    if (refused.ok()) acknowledged = State();
  }
  EXPECT_CODE(refused, absl::StatusCode::kUnavailable);
  EXPECT_TRUE(absl::StrContains(refused.message(), "No space left on device")) << refused;
  EXPECT_EQ(State(), acknowledged);
  EXPECT_OK(client_->GetQParams("wide"));
  // The operator makes room; the restart restores what was acknowledged.
  Stop();
  ASSERT_EQ(mount("tmpfs", dir_.c_str(), "tmpfs", MS_REMOUNT, "size=16m"), 0) << strerror(errno);
  ASSERT_TRUE(Start(Env::Posix()));
  EXPECT_EQ(State(), acknowledged);
  Stop();
}

// GET /healthz and /livez of the server's health endpoint, as HAProxy and the
// kubelet ask them.
struct HttpAnswer {
  int status = -1;
  std::string body;
};
HttpAnswer HttpGet(const MetricsHttpServer& http, const char* path) {
  httplib::Client client("127.0.0.1", http.port());
  HttpAnswer answer;
  if (httplib::Result result = client.Get(path)) {
    answer.status = result->status;
    answer.body = result->body;
  }
  return answer;
}

std::unique_ptr<MetricsHttpServer> HealthEndpoint(QParamsServer& server) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http = MetricsHttpServer::Start(
      HostPort{"127.0.0.1", 0}, &server.metrics(),
      {[&server] { return server.Readiness(); }, [&server] { return server.Liveness(); }});
  EXPECT_OK(http.status());
  return http.ok() ? *std::move(http) : nullptr;
}

// The write probe meets each kind of failure in turn: 503 naming it, while mutations
// still go on (a probe breaks nothing), and 200 again with the next probe that
// succeeds. Then the journal breaks: 503 and a failed liveness until restart. Then
// shutdown: 503 from its start, liveness unaffected.
TEST_P(StorageFaultTest, HealthzIs503WhileTheDataDirectoryRefusesWritesAnd200Again) {
  FaultInjectionEnv env;
  ASSERT_TRUE(Start(&env));
  Populate();
  // Under kBatched, so that no flush of the journal is pending to meet the faults
  // meant for the probe: every state durable first, and no mutation until the end.
  Stop();
  ASSERT_TRUE(Start(&env));
  std::unique_ptr<MetricsHttpServer> http = HealthEndpoint(server_->server());
  ASSERT_NE(http, nullptr);
  HttpAnswer ok = HttpGet(*http, "/healthz");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "SERVING\n");
  EXPECT_EQ(HttpGet(*http, "/livez").status, 200);

  for (auto [op, what] : {std::pair{Op::kNewFile, "cannot create"}, std::pair{Op::kAppend, "cannot write"},
                          std::pair{Op::kSync, "cannot fsync"}, std::pair{Op::kRemove, "cannot remove"}}) {
    SCOPED_TRACE(what);
    env.FailNext(op);
    const HttpAnswer refused = HttpGet(*http, "/healthz");
    EXPECT_EQ(refused.status, 503);
    EXPECT_TRUE(absl::StartsWith(refused.body, "NOT_SERVING: the data directory does not take writes ("))
        << refused.body;
    EXPECT_TRUE(absl::StrContains(refused.body, absl::StrCat(what, " ", dir_, "/health-probe (injected)")))
        << refused.body;
    EXPECT_EQ(HttpGet(*http, "/livez").status, 200) << "a failed probe needs no restart";
    EXPECT_EQ(HttpGet(*http, "/healthz").status, 200) << "the next probe succeeds";
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/health-probe"));
  EXPECT_OK(Observe("a", {5}));  // the probes broke nothing

  env.FailNext(Op::kAppend);
  EXPECT_CODE(Observe("a", {6}), absl::StatusCode::kUnavailable);
  for (const char* path : {"/healthz", "/livez"}) {
    const HttpAnswer broken = HttpGet(*http, path);
    EXPECT_EQ(broken.status, 503) << path;
    EXPECT_TRUE(absl::StrContains(broken.body, "the journal cannot be written")) << broken.body;
    EXPECT_TRUE(absl::StrContains(broken.body, "until it restarts")) << broken.body;
  }
  EXPECT_EQ(HttpGet(*http, "/healthz").status, 503) << "a broken journal stays broken";

  ASSERT_TRUE(Start(Env::Posix()));
  http = HealthEndpoint(server_->server());
  ASSERT_NE(http, nullptr);
  EXPECT_EQ(HttpGet(*http, "/healthz").status, 200) << "the restart brings it back";
  server_->server().Shutdown(absl::ZeroDuration());
  const HttpAnswer draining = HttpGet(*http, "/healthz");
  EXPECT_EQ(draining.status, 503);
  EXPECT_TRUE(absl::StartsWith(draining.body, "NOT_SERVING: shutting down")) << draining.body;
  EXPECT_EQ(HttpGet(*http, "/livez").status, 200) << "shutting down is no reason to restart";
  http.reset();  // before the server it asks
}

// Without a data directory nothing is probed: SERVING is the whole answer.
TEST(HealthEndpoint, WithoutADataDirectoryStorageIsTriviallyOk) {
  std::unique_ptr<TestServer> server = TestServer::Start();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<MetricsHttpServer> http = HealthEndpoint(server->server());
  ASSERT_NE(http, nullptr);
  EXPECT_EQ(HttpGet(*http, "/healthz").status, 200);
  EXPECT_EQ(HttpGet(*http, "/livez").status, 200);
  server->server().Shutdown(absl::ZeroDuration());
  EXPECT_EQ(HttpGet(*http, "/healthz").status, 503);
  http.reset();
}

INSTANTIATE_TEST_SUITE_P(Durability, StorageFaultTest,
                         ::testing::Values(Durability::kAlways, Durability::kBatched),
                         [](const ::testing::TestParamInfo<Durability>& info) {
                           return std::string(DurabilityName(info.param));
                         });

// ---- The journal itself: a crash between any two steps of a compaction ----

storage::v1::Record Put(const std::string& name, int64_t version) {
  storage::v1::Record record;
  record.mutable_put()->mutable_key()->set_name(name);
  record.mutable_put()->set_observation_count(version);
  return record;
}

// Names and versions: what the tests' journals hold.
using Versions = std::map<std::string, int64_t>;

// A journal started on a fresh `options.data_dir`, whose snapshots hold `*live` (one
// put per name, read at each snapshot).
absl::StatusOr<std::unique_ptr<Journal>> StartJournal(const JournalOptions& options,
                                                      const Versions* live) {
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Journal> journal, Journal::Open(options));
  QPARAMS_RETURN_IF_ERROR(journal->Recover([](const storage::v1::Record&) {}).status());
  QPARAMS_RETURN_IF_ERROR(journal->Start([live](const Journal::Emitter& emit) {
    for (const auto& [name, version] : *live) QPARAMS_RETURN_IF_ERROR(emit(Put(name, version)));
    return absl::OkStatus();
  }));
  return journal;
}

// What a journal reopened on `options` restores (the last put of each name); an
// error if recovery met a problem.
absl::StatusOr<Versions> Reopened(const JournalOptions& options) {
  QPARAMS_ASSIGN_OR_RETURN(std::unique_ptr<Journal> journal, Journal::Open(options));
  Versions state;
  QPARAMS_ASSIGN_OR_RETURN(Recovery recovery, journal->Recover([&](const storage::v1::Record& r) {
    state[r.put().key().name()] = r.put().observation_count();
  }));
  if (!recovery.problems.empty()) return absl::DataLossError(recovery.problems.front());
  return state;
}

TEST(JournalFaults, AFailedSnapshotStepLosesNothingAndAppendsGoOn) {
  // A compaction's steps after the rotation: the temporary file, its write, its
  // fsync, the rename, the directory sync. A failure leaves the older files, which
  // still hold everything, and the journal keeps taking appends.
  for (auto [op, nth] :
       {std::pair{Op::kNewFile, 2}, std::pair{Op::kAppend, 2}, std::pair{Op::kSync, 2},
        std::pair{Op::kRename, 1}, std::pair{Op::kSyncDir, 2}}) {
    SCOPED_TRACE(absl::StrCat("op ", static_cast<int>(op), " call ", nth));
    const std::string dir = TempDir();
    FaultInjectionEnv env;
    Versions acknowledged;
    JournalOptions options;
    options.data_dir = dir;
    options.durability = Durability::kAlways;
    options.compact_min_bytes = int64_t{1} << 40;  // only explicit compactions
    options.env = &env;
    {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Journal> journal, StartJournal(options, &acknowledged));
      for (int i = 0; i < 40; ++i) {
        if (i == 20) {
          env.FailNext(op, nth);
          EXPECT_CODE(journal->Compact(), absl::StatusCode::kUnavailable);
          ASSERT_OK(journal->health());
        }
        const std::string name = absl::StrCat("s", i % 7);
        ASSERT_OK_AND_ASSIGN(uint64_t sequence, journal->Append(Put(name, i)));
        ASSERT_OK(journal->Sync(sequence));
        acknowledged[name] = i;
      }
    }
    env.DropUnsyncedData();
    options.env = Env::Posix();
    ASSERT_OK_AND_ASSIGN(Versions restored, Reopened(options));
    EXPECT_EQ(restored, acknowledged);
    std::filesystem::remove_all(dir);
  }
}

TEST(JournalFaults, ACrashBetweenAnyTwoStepsOfACompactionLosesNothingAcknowledged) {
  bool completed = false;
  for (int crash_at = 0; !completed; ++crash_at) {
    SCOPED_TRACE(absl::StrCat("crash after ", crash_at, " calls of the compaction"));
    ASSERT_LT(crash_at, 100) << "the compaction never completes";
    const std::string dir = TempDir();
    FaultInjectionEnv env;
    Versions acknowledged;
    JournalOptions options;
    options.data_dir = dir;
    options.durability = Durability::kAlways;
    {
      options.env = &env;
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<Journal> journal, StartJournal(options, &acknowledged));
      for (int i = 0; i < 30; ++i) {
        const std::string name = absl::StrCat("s", i % 7);
        ASSERT_OK_AND_ASSIGN(uint64_t sequence, journal->Append(Put(name, i)));
        ASSERT_OK(journal->Sync(sequence));
        acknowledged[name] = i;
      }
      env.CrashAfter(crash_at);
      const int before = env.mutating_calls();
      journal->Compact().IgnoreError();
      // Done once the compaction made all its calls without reaching the crash.
      completed = env.mutating_calls() - before < crash_at;
      // Appends after the crash point are not acknowledged, so they need not survive.
      absl::StatusOr<uint64_t> after = journal->Append(Put("late", 1));
      if (after.ok() && journal->Sync(*after).ok()) acknowledged["late"] = 1;
    }
    env.DropUnsyncedData();
    options.env = Env::Posix();
    ASSERT_OK_AND_ASSIGN(Versions restored, Reopened(options));
    EXPECT_EQ(restored, acknowledged);
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace qparams::testing
