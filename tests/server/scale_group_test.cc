// Scale groups through the service, beyond their rows of the bad-request table
// (bad_requests_scale_groups.cc): the one-slot rule of a sharded replica (hash
// tags), tenant isolation, ListScaleGroups paging, the --max_scale_groups limit,
// members deleted under a group, and names with braces (docs/scale_groups.md,
// docs/sharding.md).

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "domain/engine.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/server/service_test_util.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using grpc::StatusCode;

// The calls of the group RPCs on one stub, as one tenant (a bearer token, or none).
class Caller {
 public:
  Caller(const TestServer& server, std::string token = "")
      : stub_(server.NewStub()), token_(std::move(token)) {}

  grpc::Status CreateSession(const std::string& name, const v1::QuantSpec& spec = {},
                             const std::string& calculator = "static") {
    grpc::ClientContext context;
    Prepare(&context);
    v1::CreateSessionRequest request;
    request.set_name(name);
    request.set_calculator(calculator);
    *request.mutable_spec() = spec;
    v1::Session session;
    return stub_->CreateSession(&context, request, &session);
  }
  grpc::Status Observe(const std::string& name, const Tensor& x) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ObserveRequest request;
    request.set_name(name);
    *request.mutable_tensor() = wire::TensorToProto(x.view());
    v1::ObserveResponse response;
    return stub_->Observe(&context, request, &response);
  }
  grpc::Status DeleteSession(const std::string& name) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::DeleteSessionRequest request;
    request.set_name(name);
    v1::DeleteSessionResponse response;
    return stub_->DeleteSession(&context, request, &response);
  }

  // `created` and `trailers`, if given, receive the response and the trailing metadata.
  grpc::Status Create(const std::string& name, const std::vector<std::string>& members,
                      v1::ScaleGroup::Share share = v1::ScaleGroup::UNION_RANGE,
                      v1::ScaleGroup* created = nullptr,
                      std::multimap<std::string, std::string>* trailers = nullptr) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::CreateScaleGroupRequest request;
    request.mutable_group()->set_name(name);
    for (const std::string& m : members) request.mutable_group()->add_members(m);
    request.mutable_group()->set_share(share);
    v1::ScaleGroup group;
    const grpc::Status status = stub_->CreateScaleGroup(&context, request, &group);
    if (created != nullptr) *created = group;
    if (trailers != nullptr) {
      for (const auto& [key, value] : context.GetServerTrailingMetadata()) {
        trailers->emplace(std::string(key.data(), key.size()),
                          std::string(value.data(), value.size()));
      }
    }
    return status;
  }
  grpc::Status Get(const std::string& name, v1::ScaleGroup* group = nullptr) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::GetScaleGroupRequest request;
    request.set_name(name);
    v1::ScaleGroup response;
    const grpc::Status status = stub_->GetScaleGroup(&context, request, &response);
    if (group != nullptr) *group = response;
    return status;
  }
  grpc::Status Delete(const std::string& name) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::DeleteScaleGroupRequest request;
    request.set_name(name);
    v1::DeleteScaleGroupResponse response;
    return stub_->DeleteScaleGroup(&context, request, &response);
  }
  grpc::Status Result(const std::string& name, v1::GroupQParams* result = nullptr) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::GetGroupQParamsRequest request;
    request.set_name(name);
    v1::GroupQParams response;
    const grpc::Status status = stub_->GetGroupQParams(&context, request, &response);
    if (result != nullptr) *result = response;
    return status;
  }
  grpc::Status List(int32_t page_size, const std::string& token, const std::string& filter,
                    v1::ListScaleGroupsResponse* response) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ListScaleGroupsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    request.set_filter(filter);
    return stub_->ListScaleGroups(&context, request, response);
  }
  // The names of every group under `filter` (one page of up to 1000).
  std::vector<std::string> Names(const std::string& filter = "") {
    v1::ListScaleGroupsResponse response;
    const grpc::Status status = List(1000, "", filter, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_TRUE(response.next_page_token().empty());
    std::vector<std::string> names;
    for (const v1::ScaleGroup& g : response.groups()) names.push_back(g.name());
    return names;
  }

 private:
  void Prepare(grpc::ClientContext* context) const {
    if (!token_.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token_));
  }

  std::unique_ptr<v1::QParamsService::Stub> stub_;
  std::string token_;
};

#define EXPECT_STATUS(call, code, fragment)                                             \
  do {                                                                                  \
    const grpc::Status status_ = (call);                                                \
    EXPECT_EQ(status_.error_code(), (code)) << status_.error_message();                 \
    EXPECT_TRUE(absl::StrContains(status_.error_message(), (fragment)))                 \
        << "\"" << status_.error_message() << "\" does not contain \"" << (fragment) << "\""; \
  } while (0)

// ---- The one-slot rule of a sharded replica ----

constexpr char kThreeReplicas[] = "0:84 r0\n85:169 r1\n170:255 r2\n";

class ShardedGroups : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(SlotMap map, SlotMap::Parse(kThreeReplicas));
    map_ = std::make_shared<const SlotMap>(std::move(map));
    ServerOptions options;
    options.engine.slot_map = map_;
    options.engine.replica_id = "r1";
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    caller_ = std::make_unique<Caller>(*server_);
  }

  // The first "<stem><i>" whose slot `replica` owns (and, if given, is not `avoid`).
  std::string Owned(const std::string& stem, const std::string& replica,
                    std::optional<int> avoid = std::nullopt) const {
    for (int i = 0;; ++i) {
      std::string name = absl::StrCat(stem, i);
      if (map_->OwnerOfSession(name) == replica && SlotOf(name) != avoid.value_or(-1)) {
        return name;
      }
    }
  }

  std::shared_ptr<const SlotMap> map_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Caller> caller_;
};

TEST_F(ShardedGroups, MembersOfAnotherSlotAreInvalidAndTheMessageExplainsHashTags) {
  const std::string group = Owned("grp", "r1");
  // Both members are r1's too, but in other slots than the group's.
  const std::string a = Owned("a", "r1", SlotOf(group));
  const std::string b = Owned("b", "r1", SlotOf(group));
  ASSERT_TRUE(caller_->CreateSession(a).ok());
  ASSERT_TRUE(caller_->CreateSession(b).ok());
  const grpc::Status refused = caller_->Create(group, {a, b});
  EXPECT_EQ(refused.error_code(), StatusCode::INVALID_ARGUMENT) << refused.error_message();
  for (const std::string& fragment :
       {absl::StrCat("\"", a, "\""), absl::StrCat("slot ", SlotOf(group)), std::string("hash tag"),
        absl::StrCat(SlotOf(a))}) {
    EXPECT_TRUE(absl::StrContains(refused.error_message(), fragment))
        << fragment << " in " << refused.error_message();
  }
  EXPECT_TRUE(caller_->Names().empty());
}

TEST_F(ShardedGroups, AGroupOfAnotherReplicasSlotIsRefusedAsSessionsAre) {
  const std::string theirs = Owned("g", "r2");
  const std::string member = Owned("m", "r1");
  ASSERT_TRUE(caller_->CreateSession(member).ok());
  std::multimap<std::string, std::string> trailers;
  const grpc::Status refused =
      caller_->Create(theirs, {member}, v1::ScaleGroup::UNION_RANGE, nullptr, &trailers);
  EXPECT_EQ(refused.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "belongs to replica r2"))
      << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), theirs));
  const auto owner = trailers.find(wire::kOwnerMetadata);
  ASSERT_NE(owner, trailers.end());
  EXPECT_EQ(owner->second, "r2");
  // The other group RPCs refuse the name the same way, and nothing was created.
  EXPECT_EQ(caller_->Get(theirs).error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(caller_->Delete(theirs).error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(caller_->Result(theirs).error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_TRUE(caller_->Names().empty());
}

TEST_F(ShardedGroups, HashTaggedNamesInOneSlotSucceed) {
  const std::string tag = Owned("layer", "r1");
  const std::string group = absl::StrCat("{", tag, "}.qkv");
  const std::vector<std::string> members = {absl::StrCat("{", tag, "}.q_proj"),
                                            absl::StrCat("w/{", tag, "}.k_proj")};
  for (const std::string& m : members) {
    ASSERT_EQ(SlotOf(m), SlotOf(tag));
    ASSERT_TRUE(caller_->CreateSession(m).ok()) << m;
    ASSERT_TRUE(caller_->Observe(m, F32({2}, {-1, 2})).ok());
  }
  v1::ScaleGroup created;
  const grpc::Status status = caller_->Create(group, members, v1::ScaleGroup::UNION_RANGE, &created);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(created.name(), group);
  v1::GroupQParams result;
  ASSERT_TRUE(caller_->Result(group, &result).ok());
  EXPECT_TRUE(result.initialized());
  EXPECT_EQ(caller_->Names(), std::vector<std::string>{group});

  // An empty tag ("{}") hashes the whole name (docs/sharding.md): such a member is in
  // the tag's slot only by chance, and refused otherwise, explaining hash tags.
  std::string empty_tag;
  for (int i = 0; empty_tag.empty(); ++i) {
    const std::string name = absl::StrCat("{}{", tag, "}.v", i);
    if (SlotOf(name) != SlotOf(tag) && map_->OwnerOfSession(name) == "r1") empty_tag = name;
  }
  ASSERT_TRUE(caller_->CreateSession(empty_tag).ok());
  EXPECT_STATUS(caller_->Create(absl::StrCat("{", tag, "}.qkv2"), {members[0], empty_tag}),
                StatusCode::INVALID_ARGUMENT, "hash tag");
  EXPECT_EQ(caller_->Names(), std::vector<std::string>{group});
}

// ---- Braces without sharding: every name of the alphabet is a name ----

TEST(GroupNames, BracesBalancedOrNotAreNamesAndGroupsTakeThem) {
  std::unique_ptr<TestServer> server = TestServer::Start();
  ASSERT_NE(server, nullptr);
  Caller caller(*server);
  // Balanced tags, empty tags, unbalanced and reversed braces, braces alone
  // (docs/sharding.md: only the hashed part depends on them).
  const std::vector<std::string> names = {"{a}", "x{a}y", "{a}{b}", "{}x", "x{", "}x{",
                                          "{",   "}",     "{}",     "{{}}"};
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(caller.CreateSession(name).ok());
    v1::ScaleGroup created;
    const grpc::Status status =
        caller.Create(absl::StrCat("g", name), {name}, v1::ScaleGroup::UNION_RANGE, &created);
    ASSERT_TRUE(status.ok()) << status.error_message();
    v1::ScaleGroup got;
    ASSERT_TRUE(caller.Get(absl::StrCat("g", name), &got).ok());
    EXPECT_EQ(got.members(0), name);
    // A group may carry the name of a session: they are separate namespaces.
    ASSERT_TRUE(caller.Create(name, {name}).ok());
  }
  EXPECT_EQ(caller.Names().size(), 2 * names.size());
  for (const std::string& name : names) {
    EXPECT_TRUE(caller.Delete(absl::StrCat("g", name)).ok());
    EXPECT_TRUE(caller.Delete(name).ok());
  }
  EXPECT_TRUE(caller.Names().empty());
}

// ---- Tenants ----

class TenantGroups : public ::testing::Test {
 protected:
  static constexpr char kTokenA[] = "token-of-tenant-a-0123";
  static constexpr char kTokenB[] = "token-of-tenant-b-0123";

  void SetUp() override {
    tokens_ = absl::StrCat(::testing::TempDir(), "/group-tokens-", getpid());
    {
      std::ofstream file(tokens_);
      file << kTokenA << " alpha\n" << kTokenB << " beta\n";
    }
    ServerOptions options;
    options.auth_tokens_file = tokens_;
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    a_ = std::make_unique<Caller>(*server_, kTokenA);
    b_ = std::make_unique<Caller>(*server_, kTokenB);
  }
  void TearDown() override { std::filesystem::remove(tokens_); }

  std::string tokens_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Caller> a_, b_;
};

TEST_F(TenantGroups, ATenantNeitherSeesAnothersGroupsNorNamesItsSessions) {
  ASSERT_TRUE(a_->CreateSession("s1").ok());
  ASSERT_TRUE(a_->CreateSession("s2").ok());
  ASSERT_TRUE(a_->Create("g", {"s1", "s2"}).ok());

  EXPECT_TRUE(b_->Names().empty());
  EXPECT_STATUS(b_->Get("g"), StatusCode::NOT_FOUND, "\"g\"");
  EXPECT_STATUS(b_->Result("g"), StatusCode::NOT_FOUND, "\"g\"");
  EXPECT_STATUS(b_->Delete("g"), StatusCode::NOT_FOUND, "\"g\"");
  // B cannot name A's sessions as members: NOT_FOUND, as for B's session calls.
  EXPECT_STATUS(b_->Create("h", {"s1"}), StatusCode::NOT_FOUND, "s1");
  EXPECT_TRUE(b_->Names().empty());
  // A's group is untouched.
  v1::ScaleGroup got;
  ASSERT_TRUE(a_->Get("g", &got).ok());
  EXPECT_EQ(got.members_size(), 2);
  EXPECT_EQ(a_->Names(), std::vector<std::string>{"g"});
}

TEST_F(TenantGroups, TheSameNamesInTwoTenantsAreIndependent) {
  for (Caller* c : {a_.get(), b_.get()}) {
    ASSERT_TRUE(c->CreateSession("s").ok());
    ASSERT_TRUE(c->CreateSession("t").ok());
  }
  ASSERT_TRUE(a_->Observe("s", F32({2}, {-1, 2})).ok());
  ASSERT_TRUE(b_->Observe("s", F32({2}, {-8, 4})).ok());
  ASSERT_TRUE(a_->Create("g", {"s"}).ok());
  ASSERT_TRUE(b_->Create("g", {"s", "t"}).ok());
  // The same name again is ALREADY_EXISTS within a tenant only.
  EXPECT_STATUS(a_->Create("g", {"t"}), StatusCode::ALREADY_EXISTS, "\"g\"");

  v1::ScaleGroup ga, gb;
  ASSERT_TRUE(a_->Get("g", &ga).ok());
  ASSERT_TRUE(b_->Get("g", &gb).ok());
  EXPECT_EQ(ga.members_size(), 1);
  EXPECT_EQ(gb.members_size(), 2);
  // Each group reads its own tenant's "s".
  v1::GroupQParams ra, rb;
  ASSERT_TRUE(a_->Result("g", &ra).ok());
  ASSERT_TRUE(b_->Result("g", &rb).ok());
  EXPECT_TRUE(ra.initialized());
  EXPECT_FALSE(rb.initialized());  // B's "t" is uncalibrated
  EXPECT_EQ(ra.min(), -1);
  EXPECT_EQ(ra.max(), 2);

  // Deleting B's group (and B's member) leaves A's.
  ASSERT_TRUE(b_->Delete("g").ok());
  ASSERT_TRUE(b_->DeleteSession("s").ok());
  ASSERT_TRUE(a_->Get("g").ok());
  ASSERT_TRUE(a_->Result("g", &ra).ok());
  EXPECT_TRUE(ra.initialized());
  EXPECT_STATUS(b_->Get("g"), StatusCode::NOT_FOUND, "\"g\"");
}

// ---- Paging ----

class GroupPaging : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    caller_ = std::make_unique<Caller>(*server_);
    ASSERT_TRUE(caller_->CreateSession("m").ok());
    // Created out of order: listings are in name order.
    for (const char* name : {"p/c", "p/a", "q/z", "p/e", "p/b", "p/d"}) {
      ASSERT_TRUE(caller_->Create(name, {"m"}).ok()) << name;
    }
  }

  // The names of each page under `filter`, following the next_page_token chain until
  // a page's token is empty (at most 11 pages).
  std::vector<std::vector<std::string>> Pages(int32_t page_size, const std::string& filter) {
    std::vector<std::vector<std::string>> pages;
    std::string token;
    do {
      v1::ListScaleGroupsResponse response;
      const grpc::Status status = caller_->List(page_size, token, filter, &response);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok() || pages.size() > 10) break;
      std::vector<std::string> names;
      for (const v1::ScaleGroup& g : response.groups()) names.push_back(g.name());
      pages.push_back(std::move(names));
      token = response.next_page_token();
    } while (!token.empty());
    return pages;
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Caller> caller_;
};

TEST_F(GroupPaging, PageSizesOneTwoAndTheDefaultChainInNameOrder) {
  using Pages = std::vector<std::vector<std::string>>;
  EXPECT_EQ(this->Pages(1, "p/"), (Pages{{"p/a"}, {"p/b"}, {"p/c"}, {"p/d"}, {"p/e"}}));
  EXPECT_EQ(this->Pages(2, "p/"), (Pages{{"p/a", "p/b"}, {"p/c", "p/d"}, {"p/e"}}));
  EXPECT_EQ(this->Pages(2, ""), (Pages{{"p/a", "p/b"}, {"p/c", "p/d"}, {"p/e", "q/z"}}));
  EXPECT_EQ(this->Pages(0, ""), (Pages{{"p/a", "p/b", "p/c", "p/d", "p/e", "q/z"}}));
  EXPECT_EQ(this->Pages(0, "q/"), (Pages{{"q/z"}}));
  EXPECT_EQ(this->Pages(0, "r/"), (Pages{{}}));
  // A page that ends exactly at the last group: no token.
  EXPECT_EQ(this->Pages(5, "p/"), (Pages{{"p/a", "p/b", "p/c", "p/d", "p/e"}}));
  // Above the cap of 1000 is no error (it is capped).
  EXPECT_EQ(this->Pages(5000, "p/"), (Pages{{"p/a", "p/b", "p/c", "p/d", "p/e"}}));
}

TEST_F(GroupPaging, ATokenResumesAfterItsGroupEvenIfThatGroupIsGoneAndKeepsItsFilter) {
  v1::ListScaleGroupsResponse first;
  ASSERT_TRUE(caller_->List(2, "", "p/", &first).ok());
  ASSERT_FALSE(first.next_page_token().empty());
  ASSERT_TRUE(caller_->Delete("p/b").ok());
  v1::ListScaleGroupsResponse second;
  ASSERT_TRUE(caller_->List(2, first.next_page_token(), "p/", &second).ok());
  ASSERT_EQ(second.groups_size(), 2);
  EXPECT_EQ(second.groups(0).name(), "p/c");
  v1::ListScaleGroupsResponse other;
  EXPECT_STATUS(caller_->List(2, first.next_page_token(), "", &other),
                StatusCode::INVALID_ARGUMENT, "page_token");
}

TEST(GroupPagingEngine, PageSizesAboveTheMaximumAreCappedAtIt) {
  Engine engine;
  ASSERT_OK(engine.CreateSession("", "m", "static", QuantSpec{}, CalculatorOptions{}).status());
  for (int i = 0; i <= Engine::kMaxPageSize; ++i) {
    ASSERT_OK(engine
                  .CreateScaleGroup("", {absl::StrCat("g", 10000 + i), {"m"},
                                         GroupShare::kUnionRange, false})
                  .status());
  }
  ASSERT_OK_AND_ASSIGN(const ScaleGroupPage page, engine.ListScaleGroups("", 5000, "", ""));
  EXPECT_EQ(page.groups.size(), static_cast<size_t>(Engine::kMaxPageSize));
  ASSERT_FALSE(page.next_page_token.empty());
  ASSERT_OK_AND_ASSIGN(const ScaleGroupPage rest,
                       engine.ListScaleGroups("", 5000, page.next_page_token, ""));
  ASSERT_EQ(rest.groups.size(), 1u);
  EXPECT_EQ(rest.groups[0].name, absl::StrCat("g", 10000 + Engine::kMaxPageSize));
  EXPECT_TRUE(rest.next_page_token.empty());
}

// ---- Limits and members ----

TEST(GroupLimit, MaxScaleGroupsRefusesTheNextGroupUntilOneIsDeleted) {
  ServerOptions options;
  options.engine.max_scale_groups = 2;
  std::unique_ptr<TestServer> server = TestServer::Start(options);
  ASSERT_NE(server, nullptr);
  Caller caller(*server);
  ASSERT_TRUE(caller.CreateSession("m").ok());
  ASSERT_TRUE(caller.Create("g1", {"m"}).ok());
  ASSERT_TRUE(caller.Create("g2", {"m"}).ok());
  v1::ListScaleGroupsResponse before, after;
  ASSERT_TRUE(caller.List(0, "", "", &before).ok());
  EXPECT_STATUS(caller.Create("g3", {"m"}), StatusCode::RESOURCE_EXHAUSTED,
                "--max_scale_groups");
  ASSERT_TRUE(caller.List(0, "", "", &after).ok());
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(before, after));
  EXPECT_STATUS(caller.Get("g3"), StatusCode::NOT_FOUND, "g3");
  ASSERT_TRUE(caller.Delete("g1").ok());
  ASSERT_TRUE(caller.Create("g3", {"m"}).ok());
  EXPECT_EQ(caller.Names(), (std::vector<std::string>{"g2", "g3"}));
}

TEST(GroupMembers, AMemberDeletedUnderAGroupFailsItsResultNamingItAndDeletingTheGroupKeepsMembers) {
  std::unique_ptr<TestServer> server = TestServer::Start();
  ASSERT_NE(server, nullptr);
  Caller caller(*server);
  for (const char* name : {"a", "b", "c"}) {
    ASSERT_TRUE(caller.CreateSession(name).ok());
    ASSERT_TRUE(caller.Observe(name, F32({2}, {-1, 2})).ok());
  }
  ASSERT_TRUE(caller.Create("g", {"a", "b", "c"}).ok());
  ASSERT_TRUE(caller.Create("h", {"a", "c"}).ok());  // a session may be in several groups
  ASSERT_TRUE(caller.Result("g").ok());
  ASSERT_TRUE(caller.DeleteSession("b").ok());
  EXPECT_STATUS(caller.Result("g"), StatusCode::FAILED_PRECONDITION, "member \"b\"");
  EXPECT_TRUE(caller.Result("h").ok());
  v1::ScaleGroup g;
  ASSERT_TRUE(caller.Get("g", &g).ok());
  EXPECT_EQ(g.members_size(), 3);  // the group still names it
  // The session back: the group answers again.
  ASSERT_TRUE(caller.CreateSession("b").ok());
  v1::GroupQParams result;
  ASSERT_TRUE(caller.Result("g", &result).ok());
  EXPECT_FALSE(result.initialized());
  ASSERT_EQ(result.uncalibrated_size(), 1);
  EXPECT_EQ(result.uncalibrated(0), "b");
  // Deleting a group deletes none of its members.
  ASSERT_TRUE(caller.Delete("g").ok());
  ASSERT_TRUE(caller.Delete("h").ok());
  for (const char* name : {"a", "b", "c"}) EXPECT_TRUE(caller.Observe(name, F32({1}, {1})).ok());
}

}  // namespace
}  // namespace qparams::testing
