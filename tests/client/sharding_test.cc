// Sharding by slot: the slot map file's rules, and a replica that owns only its
// slots' sessions, refusing the others with their owner (message and trailing
// metadata) and changing nothing.

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "qparams/client.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

constexpr char kThreeReplicas[] =
    "# slots  replica\n"
    "0:84     r0\n"
    "85:169   r1   # the middle\n"
    "\n"
    "170:254  r2\n"
    "255      r0\n";

TEST(SlotMap, ParsesRangesSingleSlotsAndComments) {
  ASSERT_OK_AND_ASSIGN(const SlotMap map, SlotMap::Parse(kThreeReplicas));
  EXPECT_EQ(map.replicas(), (std::vector<std::string>{"r0", "r1", "r2"}));
  EXPECT_EQ(map.OwnerOf(0), "r0");
  EXPECT_EQ(map.OwnerOf(84), "r0");
  EXPECT_EQ(map.OwnerOf(85), "r1");
  EXPECT_EQ(map.OwnerOf(254), "r2");
  EXPECT_EQ(map.OwnerOf(255), "r0");
  EXPECT_TRUE(map.HasReplica("r1"));
  EXPECT_FALSE(map.HasReplica("r3"));
  const std::vector<SlotMap::Range> ranges = map.Ranges();
  ASSERT_EQ(ranges.size(), 4u);
  EXPECT_EQ(ranges[1].low, 85);
  EXPECT_EQ(ranges[1].high, 169);
  EXPECT_EQ(ranges[1].replica, "r1");
  EXPECT_EQ(map.OwnerOfSession("123456789"), map.OwnerOf(SlotOf("123456789")));
}

TEST(SlotMap, RefusesMalformedOverlappingAndIncompleteMaps) {
  for (const auto& [text, rule] : std::vector<std::pair<std::string, std::string>>{
           {"0:255\n", "line 1"},
           {"0:255 r0 extra\n", "expected"},
           {"0-255 r0\n", "integers"},
           {"0:256 r0\n", "integers"},
           {"-1:255 r0\n", "integers"},
           {"+0:255 r0\n", "integers"},
           {"0:1:255 r0\n", "LOW:HIGH"},
           {"9:3 r0\n0:255 r1\n", "above"},
           {"0:255 r/0\n", "replica name"},
           {"0:255 " + std::string(65, 'r') + "\n", "replica name"},
           {"0:200 r0\n100:255 r1\n", "slot 100 is already r0's"},
           {"0:254 r0\n", "no line gives slot 255"},
           {"", "no line gives slot 0"},
       }) {
    const absl::StatusOr<SlotMap> map = SlotMap::Parse(text);
    EXPECT_CODE(map, kInvalid);
    EXPECT_TRUE(absl::StrContains(map.status().message(), rule)) << text << " -> " << map.status();
  }
}

// A name of each replica's, found by trying names: the slot function decides.
std::string NameOwnedBy(const SlotMap& map, const std::string& replica) {
  for (int i = 0;; ++i) {
    std::string name = absl::StrCat("shard/s", i);
    if (map.OwnerOfSession(name) == replica) return name;
  }
}

class ShardingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(SlotMap map, SlotMap::Parse(kThreeReplicas));
    map_ = std::make_shared<const SlotMap>(std::move(map));
    ServerOptions options;
    options.engine.slot_map = map_;
    options.engine.replica_id = "r1";
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
    mine_ = NameOwnedBy(*map_, "r1");
    theirs_ = NameOwnedBy(*map_, "r2");
  }

  std::shared_ptr<const SlotMap> map_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
  std::string mine_, theirs_;
};

TEST_F(ShardingTest, ASessionOfAnotherReplicaIsRefusedWithItsOwner) {
  v1::CreateSessionRequest create;
  create.set_name(theirs_);
  grpc::ClientContext context;
  v1::Session session;
  const grpc::Status refused = stub_->CreateSession(&context, create, &session);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "belongs to replica r2"))
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), theirs_));
  const auto owner = context.GetServerTrailingMetadata().find(wire::kOwnerMetadata);
  ASSERT_NE(owner, context.GetServerTrailingMetadata().end());
  EXPECT_EQ(std::string(owner->second.data(), owner->second.size()), "r2");

  // Nothing was created; every session method refuses the same way.
  grpc::ClientContext list_context;
  v1::ListSessionsResponse listed;
  ASSERT_TRUE(stub_->ListSessions(&list_context, {}, &listed).ok());
  EXPECT_EQ(listed.sessions_size(), 0);
  v1::GetSessionRequest get;
  get.set_name(theirs_);
  grpc::ClientContext get_context;
  EXPECT_EQ(stub_->GetSession(&get_context, get, &session).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::GetQParamsRequest qparams;
  qparams.set_name(theirs_);
  grpc::ClientContext qparams_context;
  v1::GetQParamsResponse qparams_response;
  EXPECT_EQ(stub_->GetQParams(&qparams_context, qparams, &qparams_response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(ShardingTest, OwnSessionsWorkAndAStreamFailsOnlyTheForeignMessage) {
  v1::CreateSessionRequest create;
  create.set_name(mine_);
  grpc::ClientContext context;
  v1::Session session;
  ASSERT_TRUE(stub_->CreateSession(&context, create, &session).ok());

  grpc::ClientContext stream_context;
  auto stream = stub_->ObserveStream(&stream_context);
  const Tensor x = F32({2}, {-1, 2});
  for (const std::string& name : {mine_, theirs_, mine_}) {
    v1::ObserveRequest request;
    request.set_name(name);
    *request.mutable_tensor() = wire::TensorToProto(x.view());
    ASSERT_TRUE(stream->Write(request));
  }
  stream->WritesDone();
  std::vector<v1::ObserveResponse> responses(3);
  for (v1::ObserveResponse& response : responses) ASSERT_TRUE(stream->Read(&response));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(responses[0].status().code(), 0);
  EXPECT_EQ(responses[1].status().code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(responses[1].status().message(), "belongs to replica r2"));
  EXPECT_EQ(responses[2].status().code(), 0);
  EXPECT_EQ(responses[2].observation_count(), 2);
}

TEST_F(ShardingTest, TopologyIsTheSlotMapAnyReplicaServes) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(server_->address()));
  ASSERT_OK_AND_ASSIGN(const v1::Topology topology, client->GetTopology());
  EXPECT_EQ(topology.slot_count(), kSlotCount);
  EXPECT_EQ(topology.replica_id(), "r1");
  EXPECT_EQ(std::vector<std::string>(topology.replicas().begin(), topology.replicas().end()),
            (std::vector<std::string>{"r0", "r1", "r2"}));
  ASSERT_EQ(topology.ranges_size(), 4);
  EXPECT_EQ(topology.ranges(2).low(), 170);
  EXPECT_EQ(topology.ranges(2).high(), 254);
  EXPECT_EQ(topology.ranges(2).replica(), "r2");
  EXPECT_EQ(topology.ranges(3).replica(), "r0");

  // Unsharded: one replica "" owns every slot.
  std::unique_ptr<TestServer> single = TestServer::Start();
  ASSERT_NE(single, nullptr);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> single_client, Client::Connect(single->address()));
  ASSERT_OK_AND_ASSIGN(const v1::Topology one, single_client->GetTopology());
  EXPECT_EQ(one.replica_id(), "");
  ASSERT_EQ(one.ranges_size(), 1);
  EXPECT_EQ(one.ranges(0).low(), 0);
  EXPECT_EQ(one.ranges(0).high(), kSlotCount - 1);
}

TEST_F(ShardingTest, CallsAddressedToAnotherReplicaAreRefused) {
  auto list = [](v1::QParamsService::Stub& stub, const std::string& replica) {
    grpc::ClientContext context;
    context.AddMetadata(kReplicaHeader, replica);
    v1::ListSessionsResponse response;
    return stub.ListSessions(&context, {}, &response);
  };
  EXPECT_TRUE(list(*stub_, "r1").ok());
  const grpc::Status refused = list(*stub_, "r2");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "addressed to replica \"r2\""))
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "this is replica r1"));

  // The client's own option addresses every call, and is checked like any name.
  ClientOptions options;
  options.replica = "r1";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> mine, Client::Connect(server_->address(), options));
  EXPECT_OK(mine->ListSessions(0, "", "").status());
  options.replica = "r0";
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> other, Client::Connect(server_->address(), options));
  EXPECT_CODE(other->ListSessions(0, "", "").status(), kPrecondition);
  EXPECT_CODE(other->GetTopology().status(), kPrecondition);
  options.replica = "r/1";
  EXPECT_CODE(Client::Connect(server_->address(), options).status(), kInvalid);

  // A server without sharding is no replica.
  std::unique_ptr<TestServer> single = TestServer::Start();
  ASSERT_NE(single, nullptr);
  const grpc::Status unsharded = list(*single->NewStub(), "r0");
  EXPECT_EQ(unsharded.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(unsharded.error_message(), "without sharding"))
      << unsharded.error_message();
}

// A copy of another replica's session (left in a data directory by a slot move)
// is neither listed nor reachable: not read, not deleted.
TEST(ShardingRestart, CopiesOfForeignSessionsStayOutOfSight) {
  char pattern[] = "/tmp/qparams-sharding-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ASSERT_OK_AND_ASSIGN(SlotMap parsed, SlotMap::Parse(kThreeReplicas));
  auto map = std::make_shared<const SlotMap>(std::move(parsed));
  const std::string mine = NameOwnedBy(*map, "r1"), theirs = NameOwnedBy(*map, "r2");
  ServerOptions options;
  options.data_dir = dir;
  options.durability = Durability::kAlways;
  {
    std::unique_ptr<TestServer> unsharded = TestServer::Start(options);
    ASSERT_NE(unsharded, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(unsharded->address()));
    for (const std::string& name : {mine, theirs}) {
      v1::CreateSessionRequest create;
      create.set_name(name);
      ASSERT_OK(client->CreateSession(create).status());
    }
  }
  options.engine.slot_map = map;
  options.engine.replica_id = "r1";
  {
    std::unique_ptr<TestServer> r1 = TestServer::Start(options);
    ASSERT_NE(r1, nullptr);
    ClientOptions addressed;
    addressed.replica = "r1";
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(r1->address(), addressed));
    ASSERT_OK_AND_ASSIGN(const v1::ListSessionsResponse listed, client->ListSessions(0, "", ""));
    ASSERT_EQ(listed.sessions_size(), 1);
    EXPECT_EQ(listed.sessions(0).name(), mine);
    std::vector<std::string> read;
    ASSERT_OK(client->ReadSessions("", [&read](const v1::Session& session) {
      read.push_back(session.name());
      return absl::OkStatus();
    }));
    EXPECT_EQ(read, std::vector<std::string>{mine});
    EXPECT_CODE(client->GetSession(theirs).status(), kPrecondition);
    EXPECT_CODE(client->DeleteSession(theirs), kPrecondition);
    EXPECT_OK(client->GetSession(mine).status());
  }
  std::filesystem::remove_all(dir);
}

// Scale groups restored beside foreign sessions are hidden the same way: listed only
// when their slot is the replica's, refused by name otherwise.
TEST(ShardingRestart, CopiesOfForeignScaleGroupsStayOutOfSight) {
  char pattern[] = "/tmp/qparams-sharding-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  ASSERT_OK_AND_ASSIGN(SlotMap parsed, SlotMap::Parse(kThreeReplicas));
  auto map = std::make_shared<const SlotMap>(std::move(parsed));
  const std::string mine = NameOwnedBy(*map, "r1"), theirs = NameOwnedBy(*map, "r2");
  // "{x}.group" hashes "x", the slot of the session named x.
  const auto group_of = [](const std::string& member) { return absl::StrCat("{", member, "}.g"); };
  ServerOptions options;
  options.data_dir = dir;
  options.durability = Durability::kAlways;
  {
    std::unique_ptr<TestServer> unsharded = TestServer::Start(options);
    ASSERT_NE(unsharded, nullptr);
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(unsharded->address()));
    for (const std::string& name : {mine, theirs}) {
      v1::CreateSessionRequest create;
      create.set_name(name);
      ASSERT_OK(client->CreateSession(create).status());
      v1::ScaleGroup group;
      group.set_name(group_of(name));
      group.add_members(name);
      group.set_share(v1::ScaleGroup::UNION_RANGE);
      ASSERT_OK(client->CreateScaleGroup(group).status());
    }
  }
  options.engine.slot_map = map;
  options.engine.replica_id = "r1";
  {
    std::unique_ptr<TestServer> r1 = TestServer::Start(options);
    ASSERT_NE(r1, nullptr);
    ClientOptions addressed;
    addressed.replica = "r1";
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(r1->address(), addressed));
    ASSERT_OK_AND_ASSIGN(const v1::ListScaleGroupsResponse listed,
                         client->ListScaleGroups(0, "", ""));
    ASSERT_EQ(listed.groups_size(), 1);
    EXPECT_EQ(listed.groups(0).name(), group_of(mine));
    EXPECT_CODE(client->GetScaleGroup(group_of(theirs)).status(), kPrecondition);
    EXPECT_CODE(client->GetGroupQParams(group_of(theirs)).status(), kPrecondition);
    EXPECT_OK(client->GetScaleGroup(group_of(mine)).status());
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qparams::testing
