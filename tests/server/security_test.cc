// Security: a table of credentials beside the bad-request table (bad_request_test.cc).
// Every RPC of qparams.v1.QParamsService and qparams.v1.ClusterAdmin, enumerated
// from their descriptors so that a new one cannot be left out, is called through
// one generic path (at its own service's path) with no credential, malformed ones,
// an unknown and an expired token, the other kind of token (admin for data, data
// for admin) and another tenant's; the codes are
// docs/security.md's. After every row both tenants' sessions and groups, every
// record of the engine, the topology and the slot moves are what they were, and the
// server answers health checks and a good call. Then: a server without
// --admin_tokens_file refuses every admin call; forged ImportSessions; and the
// refusals counted by reason. Plaintext to TLS and the bounds per connection are
// transport_limits_test.cc's.

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/substitute.h"
#include "common/slot.h"
#include "common/slot_map.h"
#include "domain/recovery.h"
#include "domain/slot_moves.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "qparams/storage/v1/storage.pb.h"
#include "tests/server/raw_call.h"
#include "tests/server/service_test_util.h"
#include "tests/support/subprocess.h"
#include "tests/support/test_util.h"

namespace qparams::testing {
namespace {

using grpc::StatusCode;

// The access classes (docs/security.md); every other method is a data call. The
// admin calls are ClusterAdmin's methods, and only they (SecurityTableShape).
const std::set<std::string>& AdminMethods() {
  static const auto* const m = new std::set<std::string>{
      "SetSlotMap", "SetSlotState", "ReadSlotRecords", "ImportSessions", "DropSlots"};
  return *m;
}
bool IsTopology(const std::string& method) {
  return method == "GetTopology" || method == "GetSlotMoves";
}

// Tenant a's and b's tokens, a's expired one, the admin's (and an expired one), and
// one no file lists.
constexpr char kTokenA[] = "security-token-of-tenant-a-01";
constexpr char kTokenB[] = "security-token-of-tenant-b-01";
constexpr char kExpiredA[] = "security-expired-token-of-a-01";
constexpr char kAdmin[] = "security-admin-token-0123456";
constexpr char kExpiredAdmin[] = "security-expired-admin-token-1";
constexpr char kUnknown[] = "security-token-nobody-was-given";

// The server is replica r0 of this map, and imports slots 240-245 from r1.
constexpr char kMap[] = "# epoch 1\n0:127 r0\n128:255 r1\n";
constexpr int kImportLow = 240, kImportHigh = 245;

// A name under "sec/" of slot `slot`, found by trying names.
std::string NameInSlot(int slot) {
  for (int i = 0;; ++i) {
    if (std::string name = absl::StrCat("sec/n", i); SlotOf(name) == slot) return name;
  }
}
// The sessions' and groups' names: "sec/{tag}" + `suffix`, one hash tag of r0's.
std::string Name(const std::string& suffix) {
  static const std::string* const tag = [] {
    for (int i = 0;; ++i) {
      std::string tag = absl::StrCat("{t", i, "}");
      if (SlotOf(tag) < 128) return new std::string(tag);
    }
  }();
  return absl::StrCat("sec/", *tag, suffix);
}
// Tenant a's: a-s (global_minmax, observed), a-u (static, uninitialized), a-h
// (entropy), group a-g of a-s; b's: b-s and group b-g. No response to b may hold
// kAPrefix.
const std::string kAPrefix = "a-";

// The methods of both services, as their descriptors list them.
std::vector<const google::protobuf::MethodDescriptor*> Methods() {
  std::vector<const google::protobuf::MethodDescriptor*> methods;
  for (const google::protobuf::ServiceDescriptor* service : Services()) {
    for (int i = 0; i < service->method_count(); ++i) methods.push_back(service->method(i));
  }
  return methods;
}

// A request of each method, valid for a caller allowed to make it (naming tenant a's
// sessions), and what tenant b gets for it: NOT_FOUND where it names a's session, OK
// where the call is served in b's namespace without reading a's; unset: no row (b's
// CreateSession would create b's own; RenderExport reads no session).
struct Case {
  std::vector<std::string> requests;
  std::optional<StatusCode> as_b = std::nullopt;
  bool item_status = false;  // b's code is the first response's item status
};
// `text` (protobuf text format, "$" standing for Name("")) as a serialized M.
template <typename M>
std::vector<std::string> Req(const std::string& text) {
  return TextRequest<M>(absl::StrReplaceAll(text, {{"$", Name("")}}));
}
std::map<std::string, Case> Cases() {
  const StatusCode kOk = StatusCode::OK, kNotFound = StatusCode::NOT_FOUND;
  const std::vector<std::string> observe = {ObserveReq(Name("a-s")).SerializeAsString()};
  v1::ObserveBatchRequest batch;
  *batch.add_observations() = ObserveReq(Name("a-s"));
  const std::string exported = "prefix: '$a-' format: 'onnx' allow_uninitialized: true";
  v1::RenderExportRequest render_item;  // an item after the options (uninitialized: left out)
  render_item.add_items()->set_name(Name("a-u"));
  v1::CreateSessionRequest int8;  // its spec, resolved as the item's must be
  google::protobuf::TextFormat::ParseFromString(kInt8Spec, &int8);
  *render_item.mutable_items(0)->mutable_spec() =
      wire::SpecToProto(*wire::SpecFromProto(int8.spec())->Resolve());
  render_item.mutable_items(0)->mutable_qparams()->add_shape(0);  // no scales
  return {
      {"ListCalculators", {Req<v1::ListCalculatorsRequest>(""), kOk}},
      {"Compute", {{ComputeReq(ObserveReq("").tensor())}, kOk}},
      {"CreateSession",
       {Req<v1::CreateSessionRequest>(
           absl::StrCat("name: '$a-new' calculator: 'static' ", kInt8Spec))}},
      {"GetSession", {Req<v1::GetSessionRequest>("name: '$a-s'"), kNotFound}},
      {"ListSessions", {Req<v1::ListSessionsRequest>("page_size: 1000"), kOk}},
      {"DeleteSession", {Req<v1::DeleteSessionRequest>("name: '$a-s'"), kNotFound}},
      {"ReadSessions", {Req<v1::ReadSessionsRequest>("prefix: 'sec/'"), kOk}},
      {"ExportSessions", {Req<v1::ExportSessionsRequest>(exported), kNotFound}},
      {"RenderExport",
       {std::vector<std::string>{Req<v1::RenderExportRequest>("options { " + exported + " }")[0],
                                 render_item.SerializeAsString()}}},
      {"Observe", {observe, kNotFound}},
      {"ObserveStream", {observe, kNotFound, /*item_status=*/true}},
      {"ObserveBatch", {{batch.SerializeAsString()}, kNotFound, /*item_status=*/true}},
      {"GetQParams", {Req<v1::GetQParamsRequest>("name: '$a-s'"), kNotFound}},
      {"SetExportMode", {Req<v1::SetExportModeRequest>("name: '$a-s' enabled: true"), kNotFound}},
      {"SetGranularity",
       {Req<v1::SetGranularityRequest>("name: '$a-u' granularity { per_channel { axis: 0 } }"),
        kNotFound}},
      {"GetHistogram", {Req<v1::GetHistogramRequest>("name: '$a-h'"), kNotFound}},
      {"CreateScaleGroup",  // b has no member a-s
       {Req<v1::CreateScaleGroupRequest>(
            "group { name: '$a-g2' members: '$a-s' share: UNION_RANGE }"),
        kNotFound}},
      {"GetScaleGroup", {Req<v1::GetScaleGroupRequest>("name: '$a-g'"), kNotFound}},
      {"ListScaleGroups", {Req<v1::ListScaleGroupsRequest>("page_size: 1000"), kOk}},
      {"DeleteScaleGroup", {Req<v1::DeleteScaleGroupRequest>("name: '$a-g'"), kNotFound}},
      {"GetGroupQParams", {Req<v1::GetGroupQParamsRequest>("name: '$a-g'"), kNotFound}},
      {"GetTopology", {Req<v1::GetTopologyRequest>(""), kOk}},
      {"GetSlotMoves", {Req<v1::GetSlotMovesRequest>(""), kOk}},
      // The admin calls, each one that would change the server if it were taken.
      {"SetSlotMap", {Req<v1::SetSlotMapRequest>(R"(map: "# epoch 2\n0:127 r0\n128:255 r1\n")")}},
      {"SetSlotState",
       {Req<v1::SetSlotStateRequest>("move { low: 130 high: 131 state: IMPORTING peer: 'r1' }")}},
      {"ReadSlotRecords", {Req<v1::ReadSlotRecordsRequest>("high: 255")}},
      {"ImportSessions", {Req<v1::SlotRecords>("")}},
      {"DropSlots", {Req<v1::DropSlotsRequest>("low: 200 high: 210")}},
      {"Step",
       {Req<v1::StepRequest>("rank: 0 world_size: 1 contributions { name: '$a-s' step: 0 }"),
        kNotFound, /*item_status=*/true}},
      {"ResumeSteps",
       {Req<v1::ResumeStepsRequest>("items { name: '$a-s' next_step: 0 }"), kNotFound,
        /*item_status=*/true}},
  };
}

// One row: a method called with a credential, and what it must answer.
struct Row {
  std::string method;
  std::string what;                          // the credential
  std::optional<std::string> authorization;  // the header sent, if any
  StatusCode code;
  std::string in_message;  // "" or a substring the message must hold
  bool as_b = false;       // tenant b's row: item status, no a's names in responses
};

std::vector<Row> Table() {
  const std::map<std::string, Case> cases = Cases();
  const StatusCode kUnauth = StatusCode::UNAUTHENTICATED, kDenied = StatusCode::PERMISSION_DENIED;
  std::vector<Row> rows;
  for (const google::protobuf::MethodDescriptor* m : Methods()) {
    const std::string& method = m->name();
    const bool admin = AdminMethods().count(method) > 0;
    const bool topology = IsTopology(method);
    // The token a caller of this method would hold, for the malformed headers.
    const std::string own = admin ? kAdmin : kTokenA;
    auto add = [&](std::string what, std::optional<std::string> authorization, StatusCode code,
                   std::string in_message = "") {
      rows.push_back(
          {method, std::move(what), std::move(authorization), code, std::move(in_message)});
    };
    add("no authorization", std::nullopt, kUnauth);
    add("a token without Bearer", own, kUnauth);
    add("another scheme", absl::StrCat("Basic ", own), kUnauth);
    add("Bearer and nothing", "Bearer ", kUnauth);
    add("an unknown token", Bearer(kUnknown), kUnauth);
    add("an expired token", Bearer(admin ? kExpiredAdmin : kExpiredA), kUnauth, "expired");
    if (admin) {
      add("a tenant's token", Bearer(kTokenA), kDenied);
    } else {
      add("an admin token", Bearer(kAdmin), topology ? StatusCode::OK : kDenied);
      if (topology) add("a tenant's token", Bearer(kTokenA), StatusCode::OK);
      if (auto it = cases.find(method); it != cases.end() && it->second.as_b.has_value()) {
        add("another tenant's token", Bearer(kTokenB), *it->second.as_b);
        rows.back().as_b = true;
      }
    }
  }
  return rows;
}

// The call's status, and `responses` its responses; for ObserveStream, ObserveBatch,
// Step and ResumeSteps (`item`) the status of the one item, which fails alone, cleared
// from `responses` (its message names the session asked for).
grpc::Status Outcome(const std::string& method, const Reply& reply, bool item,
                     std::vector<std::string>* responses) {
  *responses = reply.messages;
  if (!item || !reply.status.ok()) return reply.status;
  v1::ObserveResponse one;
  v1::ObserveBatchResponse batch;
  v1::StepResponse step;
  v1::ResumeStepsResponse resume;
  grpc::Status status(StatusCode::UNKNOWN, "no item response");
  if (responses->size() != 1) {
  } else if (method == "Step" && step.ParseFromString(responses->at(0)) &&
             step.contributions_size() == 1) {
    status = wire::ToGrpcStatus(wire::FromRpcStatus(step.contributions(0).status()));
    step.mutable_contributions(0)->clear_status();
    responses->at(0) = step.SerializeAsString();
  } else if (method == "ResumeSteps" && resume.ParseFromString(responses->at(0)) &&
             resume.statuses_size() == 1) {
    status = wire::ToGrpcStatus(wire::FromRpcStatus(resume.statuses(0)));
    resume.clear_statuses();
    responses->at(0) = resume.SerializeAsString();
  } else if (method == "ObserveStream" && one.ParseFromString(responses->at(0))) {
    status = wire::ToGrpcStatus(wire::FromRpcStatus(one.status()));
    one.clear_status();
    responses->at(0) = one.SerializeAsString();
  } else if (batch.ParseFromString(responses->at(0)) && batch.responses_size() == 1) {
    status = wire::ToGrpcStatus(wire::FromRpcStatus(batch.responses(0).status()));
    batch.mutable_responses(0)->clear_status();
    responses->at(0) = batch.SerializeAsString();
  }
  return status;
}

// ---- The servers ----

class Security : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/qparams_security.XXXXXX");
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    std::ofstream(dir_ + "/tokens") << kTokenA << " a\n"
                                    << kTokenB << " b\n"
                                    << kExpiredA << " a expires=2020-01-01T00:00:00Z\n";
    std::ofstream(dir_ + "/admin") << kAdmin << " ops\n"
                                   << kExpiredAdmin << " ops2 expires=2020-01-01T00:00:00Z\n";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A server that is replica r0 of kMap, with the tokens files asked for.
  std::unique_ptr<TestServer> StartSharded(bool tokens, bool admin_tokens) {
    ServerOptions options;
    options.engine.replica_id = "r0";
    options.engine.slot_map = std::make_shared<const SlotMap>(*SlotMap::Parse(kMap));
    if (tokens) options.auth_tokens_file = dir_ + "/tokens";
    if (admin_tokens) options.admin_tokens_file = dir_ + "/admin";
    return TestServer::Start(options);
  }

  // The server of the table: both files, tenant a's and b's sessions and groups (the
  // Name comments), slots kImportLow-kImportHigh importing from r1.
  void StartTableServer() {
    server_ = StartSharded(/*tokens=*/true, /*admin_tokens=*/true);
    ASSERT_NE(server_, nullptr) << "the server did not start";
    channel_ = server_->NewChannel();
    auto ok = [&](const std::string& method, const std::vector<std::string>& request,
                  const char* token) {
      const Reply reply = CallRaw(channel_.get(), Path(method), request, Bearer(token));
      ASSERT_TRUE(reply.status.ok()) << method << ": " << reply.status.error_message();
    };
    for (const auto& [name, calculator, token] : {std::tuple{"a-s", "global_minmax", kTokenA},
                                                  {"a-u", "static", kTokenA},
                                                  {"a-h", "entropy", kTokenA},
                                                  {"b-s", "global_minmax", kTokenB}}) {
      ok("CreateSession",
         Req<v1::CreateSessionRequest>(
             absl::StrCat("name: '$", name, "' calculator: '", calculator, "' ", kInt8Spec)),
         token);
      if (absl::EndsWith(name, "-s")) {
        ok("Observe", {ObserveReq(Name(name)).SerializeAsString()}, token);
      }
    }
    for (const auto& [group, token] : {std::pair{"a", kTokenA}, {"b", kTokenB}}) {
      ok("CreateScaleGroup",
         Req<v1::CreateScaleGroupRequest>(absl::Substitute(
             "group { name: '$$$0-g' members: '$$$0-s' share: UNION_RANGE }", group)),
         token);
    }
    ok("SetSlotState",
       Req<v1::SetSlotStateRequest>(absl::Substitute(
           "move { low: $0 high: $1 state: IMPORTING peer: 'r1' }", kImportLow, kImportHigh)),
       kAdmin);
  }

  // Everything a call could change, labelled: both tenants' sessions and groups as
  // the wire lists them, every record of the engine (every tenant, every field), the
  // slot map and the slot moves.
  std::vector<std::pair<std::string, std::string>> Snapshot(TestServer& server,
                                                            grpc::Channel* channel) {
    std::vector<std::pair<std::string, std::string>> parts;
    for (const char* token : {kTokenA, kTokenB}) {
      for (const char* method : {"ListSessions", "ListScaleGroups"}) {
        v1::ListSessionsRequest list;  // the same fields as ListScaleGroupsRequest's
        list.set_page_size(1000);
        const Reply reply =
            CallRaw(channel, Path(method), {list.SerializeAsString()}, Bearer(token));
        parts.emplace_back(absl::StrCat(method, " of ", token),
                           reply.status.ok() && reply.messages.size() == 1
                               ? reply.messages[0]
                               : "failed: " + reply.status.error_message());
      }
    }
    std::string records;
    for (const storage::v1::Record& r : EngineRecords::Of(server.server().engine())) {
      records += r.SerializeAsString();
    }
    parts.emplace_back("the engine's records", records);
    parts.emplace_back("the slot map", server.server().engine().slot_map()->ToText());
    parts.emplace_back("the slot moves", RenderSlotMoves(server.server().engine().SlotMoves()));
    return parts;
  }
  static void ExpectSame(const std::vector<std::pair<std::string, std::string>>& before,
                         const std::vector<std::pair<std::string, std::string>>& after) {
    ASSERT_EQ(before.size(), after.size());
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(before[i].second == after[i].second) << before[i].first << " changed";
    }
  }

  void ExpectTableServerHealthy() {
    ExpectHealthy(channel_.get(), "GetSession", Req<v1::GetSessionRequest>("name: '$a-s'"),
                  Bearer(kTokenA));
  }

  // The sum of qparams_auth_refusals_total over the series of `reason`.
  static double Refusals(TestServer& server, const std::string& reason) {
    double total = 0;
    for (absl::string_view line : absl::StrSplit(server.server().metrics().Render(), '\n')) {
      if (!absl::StartsWith(line, "qparams_auth_refusals_total{") ||
          !absl::StrContains(line, absl::StrCat("reason=\"", reason, "\""))) {
        continue;
      }
      double value = 0;
      if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &value)) total += value;
    }
    return total;
  }

  std::string dir_;
  std::unique_ptr<TestServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST(SecurityTableShape, EveryMethodHasARequestAndAClass) {
  const std::map<std::string, Case> cases = Cases();
  const std::vector<const google::protobuf::MethodDescriptor*> methods = Methods();
  ASSERT_GE(methods.size(), 28u);
  std::set<std::string> names;
  for (const auto* m : methods) {
    names.insert(m->name());
    EXPECT_EQ(cases.count(m->name()), 1u) << m->name() << " is new: add it to Cases()";
  }
  for (const auto& [name, c] : cases) EXPECT_EQ(names.count(name), 1u) << name;
  for (const std::string& name : AdminMethods()) EXPECT_EQ(names.count(name), 1u) << name;
  EXPECT_TRUE(names.count("GetTopology") && names.count("GetSlotMoves"));
  // One access class per service for cluster control: every ClusterAdmin method is
  // an admin call and every admin call is ClusterAdmin's.
  std::set<std::string> admin_service;
  for (const auto* m : methods) {
    if (m->service()->full_name() == kAdminService) admin_service.insert(m->name());
  }
  EXPECT_EQ(admin_service, AdminMethods());
  std::set<std::string> covered;
  for (const Row& row : Table()) covered.insert(row.method);
  EXPECT_EQ(covered, names);
}

// The table's control: each request, with the credential its method needs, is served
// (on a fresh server each: several change it), so a row's refusal is its credential's.
TEST_F(Security, EveryRequestIsServedWithTheRightCredential) {
  for (const auto& [method, c] : Cases()) {
    SCOPED_TRACE(method);
    ASSERT_NO_FATAL_FAILURE(StartTableServer());
    const Reply reply = CallRaw(channel_.get(), Path(method), c.requests,
                                Bearer(AdminMethods().count(method) > 0 ? kAdmin : kTokenA));
    std::vector<std::string> responses;
    const grpc::Status status = Outcome(method, reply, c.item_status, &responses);
    EXPECT_TRUE(status.ok()) << status.error_message();
  }
}

TEST_F(Security, EveryRpcRefusesBadCredentialsAndChangesNothing) {
  ASSERT_NO_FATAL_FAILURE(StartTableServer());
  const auto before = Snapshot(*server_, channel_.get());
  ASSERT_EQ(EngineRecords::Of(server_->server().engine()).size(), 6u);  // 4 sessions, 2 groups
  const std::map<std::string, Case> cases = Cases();
  const std::vector<Row> rows = Table();
  for (const Row& row : rows) {
    SCOPED_TRACE(absl::StrCat(row.method, " with ", row.what));
    const Case& c = cases.at(row.method);
    const Reply reply = CallRaw(channel_.get(), Path(row.method), c.requests, row.authorization);
    std::vector<std::string> responses;
    const grpc::Status status = Outcome(row.method, reply, row.as_b && c.item_status, &responses);
    EXPECT_EQ(status.error_code(), row.code)
        << "got " << absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()))
        << ": " << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), row.in_message))
        << status.error_message();
    for (const char* token : {kTokenA, kTokenB, kExpiredA, kAdmin, kExpiredAdmin, kUnknown}) {
      EXPECT_FALSE(absl::StrContains(status.error_message(), token))
          << "the message echoes a token";
    }
    if (row.as_b) {
      for (const std::string& response : responses) {
        EXPECT_FALSE(absl::StrContains(response, Name(kAPrefix))) << "b sees a's names";
      }
    }
    ExpectSame(before, Snapshot(*server_, channel_.get()));
    ExpectTableServerHealthy();
  }
  std::cout << "[ security ] " << rows.size() << " rows\n";
  EXPECT_GE(rows.size(), 190u);
  // Every reason the table exercised is counted (admin_off: the test below).
  for (const char* reason :
       {"missing", "malformed", "unknown", "expired", "not_admin", "not_tenant"}) {
    EXPECT_GT(Refusals(*server_, reason), 0) << reason << "\n"
                                             << server_->server().metrics().Render();
  }
}

// Without --admin_tokens_file cluster control is off: every admin call is refused
// PERMISSION_DENIED naming the flag, whatever it carries, on a server with tenants'
// tokens and on an open one.
TEST_F(Security, WithoutAdminTokensFileEveryAdminCallIsDenied) {
  const std::map<std::string, Case> cases = Cases();
  for (const bool tokens : {true, false}) {
    SCOPED_TRACE(tokens ? "with --auth_tokens_file" : "without tokens files");
    std::unique_ptr<TestServer> server = StartSharded(tokens, /*admin_tokens=*/false);
    ASSERT_NE(server, nullptr);
    std::shared_ptr<grpc::Channel> channel = server->NewChannel();
    const auto before = Snapshot(*server, channel.get());
    int rows = 0;
    for (const std::string& method : AdminMethods()) {
      using Header = std::optional<std::string>;
      for (const Header& authorization :
           {Header(), Header(Bearer(kAdmin)), Header(Bearer(kTokenA)), Header("Basic x")}) {
        SCOPED_TRACE(absl::StrCat(method, " with ", authorization.value_or("nothing")));
        const Reply reply =
            CallRaw(channel.get(), Path(method), cases.at(method).requests, authorization);
        EXPECT_EQ(reply.status.error_code(), StatusCode::PERMISSION_DENIED)
            << reply.status.error_message();
        EXPECT_TRUE(absl::StrContains(reply.status.error_message(), "--admin_tokens_file"))
            << reply.status.error_message();
        ExpectSame(before, Snapshot(*server, channel.get()));
        ++rows;
      }
    }
    EXPECT_EQ(rows, 20);
    ExpectHealthy(channel.get(), "GetTopology", {""}, Bearer(kTokenA));
    EXPECT_GE(Refusals(*server, "admin_off"), 20) << server->server().metrics().Render();
  }
}

// With --admin_tokens_file but no --auth_tokens_file, data and topology calls are
// open and ignore the authorization header (a client may carry the admin token on
// every call); admin calls still need an admin token.
TEST_F(Security, WithAdminTokensOnlyDataCallsIgnoreTheHeader) {
  std::unique_ptr<TestServer> server = StartSharded(/*tokens=*/false, /*admin_tokens=*/true);
  ASSERT_NE(server, nullptr);
  std::shared_ptr<grpc::Channel> channel = server->NewChannel();
  for (const auto& [method, c] : Cases()) {
    for (const std::string& header : {std::string("Basic x"), Bearer(kUnknown), Bearer(kAdmin),
                                      Bearer(kExpiredA), Bearer(kTokenA)}) {
      SCOPED_TRACE(absl::StrCat(method, " with ", header));
      const StatusCode code =
          CallRaw(channel.get(), Path(method), c.requests, header).status.error_code();
      if (AdminMethods().count(method) > 0) {
        if (header != Bearer(kAdmin)) {
          EXPECT_EQ(code, StatusCode::UNAUTHENTICATED);
        }
      } else {
        EXPECT_NE(code, StatusCode::UNAUTHENTICATED);
        EXPECT_NE(code, StatusCode::PERMISSION_DENIED);
      }
    }
  }
  ExpectHealthy(channel.get(), "ListCalculators", {""}, std::nullopt);
}

// ImportSessions writes whatever records it is given into every tenant's store: a
// caller without the admin token imports nothing, garbage is INVALID_ARGUMENT, and a
// well-formed record (a real one, edited) for a slot this replica is not importing,
// or one it owns, is refused; into an importing slot the same record is taken.
TEST_F(Security, ForgedImportsAreRefused) {
  ASSERT_NO_FATAL_FAILURE(StartTableServer());
  // A real record of a-s, made into forgeries.
  storage::v1::Record real;
  for (const storage::v1::Record& r : EngineRecords::Of(server_->server().engine())) {
    if (r.has_put() && r.put().key().name() == Name("a-s")) real = r;
  }
  ASSERT_TRUE(real.has_put());
  auto forged = [&](const std::string& tenant, const std::string& name) {
    storage::v1::Record r = real;
    r.mutable_put()->mutable_key()->set_tenant(tenant);
    r.mutable_put()->mutable_key()->set_name(name);
    r.mutable_put()->set_observation_count(1000000);
    v1::SlotRecords batch;
    batch.add_records(r.SerializeAsString());
    return batch.SerializeAsString();
  };
  const std::string not_importing = NameInSlot(130);  // r1's, not being imported
  const std::string importing = NameInSlot(kImportLow);
  v1::SlotRecords garbage;
  garbage.add_records("\xff\xff not a storage record");
  // What, with which credential, the forged message, the code (unset: the engine's).
  const std::vector<
      std::tuple<std::string, std::optional<std::string>, std::string, std::optional<StatusCode>>>
      attempts = {
          {"no token", std::nullopt, forged("b", importing), StatusCode::UNAUTHENTICATED},
          {"a tenant's token", Bearer(kTokenA), forged("a", importing),
           StatusCode::PERMISSION_DENIED},
          {"garbage bytes", Bearer(kAdmin), garbage.SerializeAsString(),
           StatusCode::INVALID_ARGUMENT},
          {"a slot r1 owns, not importing", Bearer(kAdmin), forged("b", not_importing), {}},
          {"a's own session, a slot r0 owns", Bearer(kAdmin), forged("a", Name("a-s")), {}},
      };
  const auto before = Snapshot(*server_, channel_.get());
  for (const auto& [what, authorization, request, code] : attempts) {
    SCOPED_TRACE(what);
    const Reply reply = CallRaw(channel_.get(), Path("ImportSessions"), {request}, authorization);
    // If this fails for the slots rows, the ENGINE accepted a forged record for a slot
    // it is not importing: a bug of Engine::ImportOne, not of this test.
    EXPECT_FALSE(reply.status.ok()) << "a forged import was accepted";
    if (code.has_value()) {
      EXPECT_EQ(reply.status.error_code(), *code) << reply.status.error_message();
    }
    ExpectSame(before, Snapshot(*server_, channel_.get()));
    ExpectTableServerHealthy();
  }
  // The control: the forgery's shape is one the engine takes, into an importing slot.
  const Reply taken =
      CallRaw(channel_.get(), Path("ImportSessions"), {forged("b", importing)}, Bearer(kAdmin));
  EXPECT_TRUE(taken.status.ok()) << taken.status.error_message();
  EXPECT_EQ(EngineRecords::Of(server_->server().engine()).size(), 7u);
}

}  // namespace
}  // namespace qparams::testing
