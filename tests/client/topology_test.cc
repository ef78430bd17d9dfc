// Topology that changes while serving: the slot map's epoch (parsed, rendered back),
// Engine::SetSlotMap (older, equal and newer epochs, a replica that owns no slot,
// persistence across a restart) and the admin RPC SetSlotMap (its authorization:
// only with an admin token of --admin_tokens_file, every admin call refused on a
// server without that file; and a bad map that changes nothing).

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "domain/engine.h"
#include "gtest/gtest.h"
#include "qparams/client.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

constexpr char kEpoch1[] =
    "# epoch 1\n"
    "0:127    r0\n"
    "128:255  r1\n";
// Slots 100:127 move from r0 to r1.
constexpr char kEpoch2[] =
    "# epoch 2\n"
    "0:99     r0\n"
    "100:255  r1\n";
// r1 is gone: r0 owns everything.
constexpr char kEpoch3[] =
    "# epoch 3\n"
    "0:255    r0\n";

std::shared_ptr<const SlotMap> Map(const std::string& text) {
  absl::StatusOr<SlotMap> map = SlotMap::Parse(text);
  EXPECT_OK(map.status());
  return std::make_shared<const SlotMap>(*std::move(map));
}

// The first name "topo/sN" whose slot is in [low, high].
std::string NameInSlots(int low, int high) {
  for (int i = 0;; ++i) {
    std::string name = absl::StrCat("topo/s", i);
    if (const int slot = SlotOf(name); slot >= low && slot <= high) return name;
  }
}

std::string TempDir() {
  char pattern[] = "/tmp/qparams-topology-XXXXXX";
  EXPECT_NE(mkdtemp(pattern), nullptr);
  return pattern;
}

// A TempDir() removed with what it holds when the test ends, however it ends.
struct ScopedTempDir {
  ~ScopedTempDir() { std::filesystem::remove_all(path); }
  const std::string path = TempDir();
};

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(SlotMapEpoch, IsReadFromItsCommentLineAndDefaultsToZero) {
  ASSERT_OK_AND_ASSIGN(const SlotMap none, SlotMap::Parse("0:255 r0\n"));
  EXPECT_EQ(none.epoch(), 0);
  ASSERT_OK_AND_ASSIGN(const SlotMap seven,
                       SlotMap::Parse("# a comment\n  #   epoch   7\n# epochs are versions\n"
                                      "0:255 r0\n"));
  EXPECT_EQ(seven.epoch(), 7);
  ASSERT_OK_AND_ASSIGN(const SlotMap big, SlotMap::Parse("#epoch 9000000000\n0:255 r0\n"));
  EXPECT_EQ(big.epoch(), 9000000000);
  // Only the epoch tells them apart.
  EXPECT_TRUE(none.SameOwners(seven));
  EXPECT_NE(none, seven);
  EXPECT_EQ(seven, seven.WithEpoch(7));
  EXPECT_EQ(none.WithEpoch(7), seven);
  ASSERT_OK_AND_ASSIGN(const SlotMap ranged, SlotMap::FromRanges({{0, 255, "r0"}}, 4));
  EXPECT_EQ(ranged.epoch(), 4);
  EXPECT_CODE(SlotMap::FromRanges({{0, 255, "r0"}}, -1).status(), kInvalid);
}

TEST(SlotMapEpoch, RefusesMalformedEpochLinesNamingTheLine) {
  for (const auto& [text, rule] : std::vector<std::pair<std::string, std::string>>{
           {"0:255 r0\n# epoch -1\n", "line 2"},
           {"# epoch x\n0:255 r0\n", "\"# epoch N\""},
           {"# epoch +3\n0:255 r0\n", "non-negative integer"},
           {"# epoch\n0:255 r0\n", "\"# epoch N\""},
           {"# epoch 1 2\n0:255 r0\n", "\"# epoch N\""},
           {"# epoch 99999999999999999999\n0:255 r0\n", "non-negative integer"},
           {"# epoch 1\n# epoch 2\n0:255 r0\n", "a second epoch line"},
       }) {
    const absl::StatusOr<SlotMap> map = SlotMap::Parse(text);
    EXPECT_CODE(map, kInvalid);
    EXPECT_TRUE(absl::StrContains(map.status().message(), rule)) << text << " -> " << map.status();
  }
}

TEST(SlotMapEpoch, RendersToTextThatParsesBackEqual) {
  ASSERT_OK_AND_ASSIGN(const SlotMap map,
                       SlotMap::Parse("# epoch 12\n0:9 r0\n10 r1\n11:200 r0\n201:255 r2\n"));
  const std::string text = map.ToText();
  EXPECT_EQ(text,
            "# epoch 12\n"
            "# slots   replica\n"
            "0:9       r0\n"
            "10:10     r1\n"
            "11:200    r0\n"
            "201:255   r2\n");
  ASSERT_OK_AND_ASSIGN(const SlotMap again, SlotMap::Parse(text));
  EXPECT_EQ(again, map);
  EXPECT_EQ(map.SlotsOf("r0"), 10 + 190);
  EXPECT_EQ(map.SlotsOf("r1"), 1);
  EXPECT_EQ(map.SlotsOf("r9"), 0);
}

TEST(SlotMapEpoch, DescribesWhichSlotsChangeOwner) {
  const auto one = Map(kEpoch1), two = Map(kEpoch2), three = Map(kEpoch3);
  EXPECT_EQ(SlotMap::DescribeChange(*one, *two), "100:127 r0->r1");
  EXPECT_EQ(SlotMap::DescribeChange(*two, *three), "100:255 r1->r0");
  EXPECT_EQ(SlotMap::DescribeChange(*one, one->WithEpoch(5)), "no slot changes owner");
  const std::vector<SlotMap::Range> changed = two->ChangedFrom(*one);
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].low, 100);
  EXPECT_EQ(changed[0].high, 127);
  EXPECT_EQ(changed[0].replica, "r1");
}

EngineOptions Replica(const std::string& id, const std::string& map) {
  EngineOptions options;
  options.replica_id = id;
  options.slot_map = Map(map);
  return options;
}

TEST(EngineSetSlotMap, TakesNewerEpochsAndRefusesOlderOnes) {
  Engine engine(Replica("r1", kEpoch1));
  const std::string moving = NameInSlots(100, 127);
  EXPECT_CODE(engine.CreateSession("", moving, "global_minmax", {}, {}), kPrecondition);

  ASSERT_OK(engine.SetSlotMap(Map(kEpoch2)));
  EXPECT_EQ(engine.slot_map()->epoch(), 2);
  ASSERT_OK(engine.CreateSession("", moving, "global_minmax", {}, {}).status());

  // The same map again is a no-op; the same epoch with other owners is refused.
  EXPECT_OK(engine.SetSlotMap(Map(kEpoch2)));
  const absl::Status same_epoch =
      engine.SetSlotMap(std::make_shared<const SlotMap>(Map(kEpoch1)->WithEpoch(2)));
  EXPECT_CODE(same_epoch, kPrecondition);
  EXPECT_TRUE(absl::StrContains(same_epoch.message(), "epoch 2")) << same_epoch;
  EXPECT_TRUE(absl::StrContains(same_epoch.message(), "100:127 r1->r0")) << same_epoch;

  const absl::Status older = engine.SetSlotMap(Map(kEpoch1));
  EXPECT_CODE(older, kPrecondition);
  EXPECT_TRUE(absl::StrContains(older.message(), "slot map epoch 1 is older than replica r1's "
                                                 "epoch 2"))
      << older;
  EXPECT_EQ(engine.slot_map()->epoch(), 2);
  EXPECT_OK(engine.GetSession("", moving).status());
  EXPECT_CODE(engine.SetSlotMap(nullptr), kInvalid);
}

TEST(EngineSetSlotMap, AReplicaMayOwnNoSlot) {
  // A new replica r1 the map does not name yet: everything is r0's.
  Engine engine(Replica("r1", kEpoch3));
  const std::string name = NameInSlots(200, 255);
  const absl::StatusOr<SessionInfo> refused =
      engine.CreateSession("", name, "global_minmax", {}, {});
  EXPECT_CODE(refused, kPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "belongs to replica r0"))
      << refused.status();
  EXPECT_EQ(refused.status().GetPayload(kOwnerPayload).value_or(absl::Cord()), "r0");
  ASSERT_OK_AND_ASSIGN(const SessionPage page, engine.ListSessions("", 0, "", ""));
  EXPECT_TRUE(page.sessions.empty());

  // Then slots move to it (epoch 4), and away again (epoch 5).
  ASSERT_OK(engine.SetSlotMap(Map("# epoch 4\n0:127 r0\n128:255 r1\n")));
  ASSERT_OK(engine.CreateSession("", name, "global_minmax", {}, {}).status());
  ASSERT_OK(engine.SetSlotMap(Map("# epoch 5\n0:255 r0\n")));
  EXPECT_CODE(engine.GetSession("", name).status(), kPrecondition);
  ASSERT_OK_AND_ASSIGN(const SessionPage hidden, engine.ListSessions("", 0, "", ""));
  EXPECT_TRUE(hidden.sessions.empty());
}

TEST(EngineSetSlotMap, AnEngineWithoutShardingTakesNoMap) {
  Engine engine;
  const absl::Status refused = engine.SetSlotMap(Map(kEpoch1));
  EXPECT_CODE(refused, kPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "not a replica")) << refused;
  EXPECT_EQ(engine.slot_map(), nullptr);
}

TEST(EngineSetSlotMap, PersistsTheMapAndARestartKeepsTheGreatestEpoch) {
  const std::string dir = TempDir();
  EngineOptions options = Replica("r1", kEpoch1);
  options.journal.data_dir = dir;
  options.journal.durability = Durability::kAlways;
  const std::string path = absl::StrCat(dir, "/", kSlotMapFileName);
  {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
    EXPECT_EQ(ReadWhole(path), Map(kEpoch1)->ToText());  // the start's map, persisted
    ASSERT_OK(engine->SetSlotMap(Map(kEpoch2)));
    EXPECT_EQ(ReadWhole(path), Map(kEpoch2)->ToText());
  }
  {
    // --slot_map still says epoch 1: the persisted epoch 2 wins.
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
    EXPECT_EQ(*engine->slot_map(), *Map(kEpoch2));
    EXPECT_CODE(engine->SetSlotMap(Map(kEpoch1)), kPrecondition);
  }
  {
    // A newer --slot_map wins over the persisted map, and is persisted.
    options.slot_map = Map(kEpoch3);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Engine> engine, Engine::Open(options));
    EXPECT_EQ(*engine->slot_map(), *Map(kEpoch3));
    EXPECT_EQ(ReadWhole(path), Map(kEpoch3)->ToText());
  }
  {
    // A persisted map that does not parse stops the start, naming the file.
    std::ofstream(path) << "0:12 r0\n";
    const absl::StatusOr<std::unique_ptr<Engine>> broken = Engine::Open(options);
    EXPECT_CODE(broken.status(), kPrecondition);
    EXPECT_TRUE(absl::StrContains(broken.status().message(), path)) << broken.status();
  }
  std::filesystem::remove_all(dir);
}

// ---- the admin RPCs ----
// ClusterAdmin's SetSlotMap, SetSlotState, ReadSlotRecords, ImportSessions and
// DropSlots take an admin token of --admin_tokens_file (kTestAdminToken of
// service_test_util.h's WriteAdminTokensFile); a server without that file refuses
// them all.

constexpr char kTenantToken[] = "tenant-token-0123456789";

// A tokens file of one tenant "a" holding kTenantToken, in `dir`.
std::string WriteTenantTokensFile(const std::string& dir) {
  const std::string path = dir + "/tokens";
  std::ofstream(path) << kTenantToken << " a\n";
  return path;
}

ServerOptions ReplicaServer(const std::string& id, const std::string& map,
                            const std::string& admin_tokens_file = "") {
  ServerOptions options;
  options.engine = Replica(id, map);
  options.admin_tokens_file = admin_tokens_file;
  return options;
}

TEST(SetSlotMapRpc, ReplacesTheMapAndAnswersTheTopology) {
  const ScopedTempDir dir;
  std::unique_ptr<TestServer> server =
      TestServer::Start(ReplicaServer("r1", kEpoch1, WriteAdminTokensFile(dir.path)));
  ASSERT_NE(server, nullptr);
  ClientOptions admin;
  admin.bearer_token = kTestAdminToken;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server->address(), admin));
  ASSERT_OK_AND_ASSIGN(const v1::Topology before, client->GetTopology());
  EXPECT_EQ(before.epoch(), 1);

  ASSERT_OK_AND_ASSIGN(const v1::Topology after, client->SetSlotMap(kEpoch2));
  EXPECT_EQ(after.epoch(), 2);
  EXPECT_EQ(after.replica_id(), "r1");
  ASSERT_EQ(after.ranges_size(), 2);
  EXPECT_EQ(after.ranges(1).low(), 100);
  ASSERT_OK_AND_ASSIGN(const v1::Topology read, client->GetTopology());
  EXPECT_EQ(read.epoch(), 2);

  // Refusals change nothing.
  const absl::StatusOr<v1::Topology> older = client->SetSlotMap(kEpoch1);
  EXPECT_CODE(older.status(), kPrecondition);
  EXPECT_TRUE(absl::StrContains(older.status().message(), "epoch 1 is older")) << older.status();
  const absl::StatusOr<v1::Topology> bad = client->SetSlotMap("# epoch 9\n0:200 r0\n");
  EXPECT_CODE(bad.status(), kInvalid);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "map: slot map: no line gives slot 201"))
      << bad.status();
  ASSERT_OK_AND_ASSIGN(const v1::Topology unchanged, client->GetTopology());
  EXPECT_EQ(unchanged.epoch(), 2);

  // Addressed to another replica through a balancer: refused.
  ClientOptions addressed = admin;
  addressed.replica = "r0";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> to_r0,
                       Client::Connect(server->address(), addressed));
  EXPECT_CODE(to_r0->SetSlotMap(kEpoch3).status(), kPrecondition);
  EXPECT_EQ(server->server().engine().slot_map()->epoch(), 2);
}

// Cluster control is off on a server without --admin_tokens_file, with or without
// --auth_tokens_file: each of the five admin calls is refused PERMISSION_DENIED
// naming the flag, whatever token it carries (none, a tenant's, one that would be an
// admin's elsewhere), and changes nothing. (Before, a server without any tokens file
// took them from anyone.)
TEST(SetSlotMapRpc, AServerWithoutAdminTokensRefusesEveryAdminCall) {
  const ScopedTempDir dir;
  const std::string tokens = WriteTenantTokensFile(dir.path);
  for (const bool with_tenants : {false, true}) {
    ServerOptions options = ReplicaServer("r1", kEpoch1);
    if (with_tenants) options.auth_tokens_file = tokens;
    std::unique_ptr<TestServer> server = TestServer::Start(options);
    ASSERT_NE(server, nullptr);
    const std::unique_ptr<v1::ClusterAdmin::Stub> stub = server->NewAdminStub();
    for (const std::string token : {"", kTenantToken, kTestAdminToken}) {
      auto prepare = [&token](grpc::ClientContext& context) {
        context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
        if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
      };
      auto expect_refused = [&](const char* method, const grpc::Status& status) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << method << ", token \"" << token << "\", tenants " << with_tenants << ": "
            << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(), "--admin_tokens_file"))
            << method << ": " << status.error_message();
        if (!token.empty()) {
          EXPECT_FALSE(absl::StrContains(status.error_message(), token)) << method;
        }
      };
      {
        grpc::ClientContext context;
        prepare(context);
        v1::SetSlotMapRequest request;
        request.set_map(kEpoch2);
        v1::Topology response;
        expect_refused("SetSlotMap", stub->SetSlotMap(&context, request, &response));
      }
      {
        grpc::ClientContext context;
        prepare(context);
        v1::SetSlotStateRequest request;
        request.mutable_move()->set_low(200);
        request.mutable_move()->set_high(210);
        request.mutable_move()->set_state(v1::SlotMove::MIGRATING);
        request.mutable_move()->set_peer("r0");
        v1::SlotMoves response;
        expect_refused("SetSlotState", stub->SetSlotState(&context, request, &response));
      }
      {
        grpc::ClientContext context;
        prepare(context);
        v1::ReadSlotRecordsRequest request;
        request.set_low(200);
        request.set_high(210);
        std::unique_ptr<grpc::ClientReader<v1::SlotRecords>> reader =
            stub->ReadSlotRecords(&context, request);
        v1::SlotRecords records;
        int read = 0;
        while (reader->Read(&records)) ++read;
        EXPECT_EQ(read, 0);
        expect_refused("ReadSlotRecords", reader->Finish());
      }
      {
        grpc::ClientContext context;
        prepare(context);
        v1::ImportSessionsResponse response;
        std::unique_ptr<grpc::ClientWriter<v1::SlotRecords>> writer =
            stub->ImportSessions(&context, &response);
        writer->Write(v1::SlotRecords());  // may fail once the server has refused
        writer->WritesDone();
        expect_refused("ImportSessions", writer->Finish());
      }
      {
        grpc::ClientContext context;
        prepare(context);
        v1::DropSlotsRequest request;
        request.set_low(200);
        request.set_high(210);
        v1::DropSlotsResponse response;
        expect_refused("DropSlots", stub->DropSlots(&context, request, &response));
      }
    }
    EXPECT_EQ(server->server().engine().slot_map()->epoch(), 1);
    EXPECT_TRUE(server->server().engine().SlotMoves().empty());
  }
}

// With --admin_tokens_file: no token or one that no file lists is UNAUTHENTICATED, a
// tenant's token PERMISSION_DENIED (it is no admin's), each saying so without the
// token, and only an admin's token sets the map.
TEST(SetSlotMapRpc, NeedsAnAdminTokenOfTheAdminTokensFile) {
  const ScopedTempDir dir;
  ServerOptions options = ReplicaServer("r1", kEpoch1, WriteAdminTokensFile(dir.path));
  options.auth_tokens_file = WriteTenantTokensFile(dir.path);
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  for (const auto& [token, code] : std::vector<std::pair<std::string, absl::StatusCode>>{
           {"", absl::StatusCode::kUnauthenticated},
           {"not-a-token-of-either-file", absl::StatusCode::kUnauthenticated},
           {kTenantToken, absl::StatusCode::kPermissionDenied}}) {
    ClientOptions caller;
    caller.bearer_token = token;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                         Client::Connect(server->address(), caller));
    const absl::StatusOr<v1::Topology> refused = client->SetSlotMap(kEpoch2);
    EXPECT_CODE(refused.status(), code) << "token \"" << token << "\"";
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "--admin_tokens_file"))
        << refused.status();
    if (!token.empty()) {
      EXPECT_FALSE(absl::StrContains(refused.status().message(), token)) << refused.status();
    }
  }
  EXPECT_EQ(server->server().engine().slot_map()->epoch(), 1);
  ClientOptions admin;
  admin.bearer_token = kTestAdminToken;
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server->address(), admin));
  ASSERT_OK_AND_ASSIGN(const v1::Topology topology, client->SetSlotMap(kEpoch2));
  EXPECT_EQ(topology.epoch(), 2);
}

}  // namespace
}  // namespace qparams::testing
