// The table of bad requests (bad_request_table.h; the rows of each subsystem are in
// bad_requests_*.cc), each row against a fresh in-process server that holds
// sessions and scale groups in varied states, for two tenants. A row's call must fail
// with the row's code and a message naming its field; afterwards the whole store
// (ListSessions of every session and ListScaleGroups of every group, of both tenants,
// every field, times included) must be byte-for-byte what it was before the row
// (api.md: "A failed call changes nothing").

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/histogram.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "proto/status.h"
#include "tests/server/bad_request_table.h"
#include "tests/server/service_test_util.h"

namespace qparams::testing::bad_request {
namespace {

std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

// The whole table, numbered in this order.
std::vector<Row> BadRequests(const Tokens& tokens) {
  std::vector<Row> rows;
  auto append = [&rows](std::vector<Row> part) {
    for (Row& row : part) rows.push_back(std::move(row));
  };
  append(TensorRows());
  append(SpecRows());
  append(SessionRows(tokens));
  append(ObservationRows());
  append(HistogramRows());
  append(GranularityRows());
  append(Nvfp4Rows());
  append(ScaleGroupRows(tokens));
  append(SlotRows());
  return rows;
}

// One test per row of the table (the parameter is the row's index), each on a fresh
// server holding the same sessions and groups in varied states, for two tenants.
// Named for the technique, as the ctest entries of its tests are
// (BadRequest/Hardening.*).
class Hardening : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    tokens_file_ = absl::StrCat(::testing::TempDir(), "/hardening-tokens-", getpid());
    {
      std::FILE* file = std::fopen(tokens_file_.c_str(), "w");
      ASSERT_NE(file, nullptr);
      std::fprintf(file, "%s a\n%s b\n", kTokenA, kTokenB);
      std::fclose(file);
    }
    ServerOptions options;
    options.service.max_tensor_elements = kMaxElements;
    options.engine.max_scale_groups = kGroups;
    options.auth_tokens_file = tokens_file_;
    admin_tokens_file_ = absl::StrCat(tokens_file_, "-admin");
    {
      std::FILE* file = std::fopen(admin_tokens_file_.c_str(), "w");
      ASSERT_NE(file, nullptr);
      std::fprintf(file, "%s ops\n", kAdminToken);
      std::fclose(file);
    }
    options.admin_tokens_file = admin_tokens_file_;
    server_ = TestServer::Start(options);
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
    admin_stub_ = server_->NewAdminStub();
    Create(CreateReq(kStatic, "static", Spec("int8", v1::ASYMMETRIC, PerChannel(1))));
    Create(CreateReq(kMovingAvg, "moving_average",
                     Spec("uint8", v1::ASYMMETRIC, PerChannel(0), v1::ACTIVATION), 0.25));
    Observe(ObserveTensorReq(kMovingAvg, Bf16({2, 3}, {-1, 0.5, 2, 3, -4, 0.25})));
    Create(CreateReq(kExport, "global_minmax", Spec("int4")));
    Observe(ObserveTensorReq(kExport, F32({4}, {1, -2, 3, 0.5})));
    {
      grpc::ClientContext context;
      Prepare(&context);
      v1::Session session;
      ASSERT_TRUE(stub_->SetExportMode(&context, ExportReq(kExport, true), &session).ok());
      ASSERT_TRUE(session.export_mode());
    }
    Create(CreateReq(kBlock, "static", Spec("int8", v1::SYMMETRIC, PerBlockMulti({-1, 2}))));
    Observe(ObserveTensorReq(kBlock, F16({2, 4}, {1, -2, 3, 4, -5, 6, 7, 0.5})));
    const v1::HistogramParams bins256 = Params([](auto& p) { p.set_num_bins(256); });
    Create(CreateHistReq("percentile", Spec(), bins256, kHist));
    Observe(ObserveHistReq(kHist, {}));
    Create(CreateHistReq("mse", Spec(), bins256, kHistFull));
    Observe(HistReq(kHistFull, [](auto& f) { f.counts[128] = kHistogramValueLimit - 5; }));
    Create(CreateHistReq("entropy", Spec(), v1::HistogramParams(), kHistEmpty));
    for (const auto& [name, convention, amax] : {std::tuple{kNvfp4Ct, "compressed_tensors", 5.0},
                                                 std::tuple{kNvfp4CtK, "compressed_tensors", 6.0},
                                                 std::tuple{kNvfp4Mo, "modelopt", 5.0}}) {
      v1::QuantSpec spec = WithScaleDType(
          Spec("float4_e2m1fn_x2", v1::SYMMETRIC, PerBlockAxis(-1, {16})), "float8_e4m3fn");
      spec.set_convention(convention);
      Create(CreateReq(name, "global_minmax", spec));
      std::vector<double> values(64);
      for (size_t i = 0; i < values.size(); ++i)
        values[i] = amax * (static_cast<double>(i) / 32 - 1);
      Observe(ObserveTensorReq(name, F32({2, 32}, values)));
    }
    CreateGroups();
    tokens_.for_all = FirstPageToken("");
    tokens_.for_prefix = FirstPageToken(kPrefix);
    tokens_.for_groups = FirstGroupPageToken(kGroupPrefix);
  }

  void TearDown() override {
    std::remove(tokens_file_.c_str());
    std::remove(admin_tokens_file_.c_str());
  }

  // The sessions and groups of the kGrp* and kGroup* comments, for both tenants.
  void CreateGroups() {
    const v1::QuantSpec nvfp4 = [] {
      v1::QuantSpec spec = WithScaleDType(
          Spec("float4_e2m1fn_x2", v1::SYMMETRIC, PerBlockAxis(-1, {16})), "float8_e4m3fn");
      spec.set_convention("compressed_tensors");
      return spec;
    }();
    std::vector<double> values(64);
    for (size_t i = 0; i < values.size(); ++i) values[i] = 3.0 * (static_cast<double>(i) / 32 - 1);
    for (const auto& [name, token, tensor] : {std::tuple{kGrpQ, kTokenA, F32({2, 32}, values)},
                                              std::tuple{kGrpK, kTokenA, F32({2, 32}, values)},
                                              std::tuple{kGrpV, kTokenA, Bf16({2, 32}, values)},
                                              std::tuple{kGrpQ, kTokenB, F32({2, 32}, values)},
                                              std::tuple{kBOnly, kTokenB, F32({2, 32}, values)}}) {
      Create(CreateReq(name, "global_minmax", nvfp4), token);
      Observe(ObserveTensorReq(name, tensor), token);
    }
    for (const char* name : {kGrpUa, kGrpUb, kGrpDoomed}) {
      Create(CreateReq(name, "static", Spec("int8")));
    }
    const int kGlobalAmax = v1::ScaleGroup::GLOBAL_AMAX;
    const int kUnionRange = v1::ScaleGroup::UNION_RANGE;
    CreateGroup(GroupReq(kGroupQk, {kGrpQ, kGrpK}, kGlobalAmax));
    CreateGroup(GroupReq(kGroupDtypes, {kGrpQ, kGrpV}, kGlobalAmax));
    CreateGroup(GroupReq(kGroupDrift, {kGrpUa, kGrpUb}, kUnionRange));
    CreateGroup(GroupReq(kGroupOrphan, {kGrpUa, kGrpDoomed}, kUnionRange));
    CreateGroup(GroupReq(kGroupHist, {kHist}, kUnionRange));
    CreateGroup(GroupReq(kGroupB, {kGrpQ}, kGlobalAmax), kTokenB);
    {
      grpc::ClientContext context;
      Prepare(&context);
      v1::Session session;
      ASSERT_TRUE(
          stub_->SetGranularity(&context, GranularityReq(kGrpUb, PerChannel(0)), &session).ok());
    }
    {
      grpc::ClientContext context;
      Prepare(&context);
      v1::DeleteSessionResponse response;
      ASSERT_TRUE(
          stub_->DeleteSession(&context, Named<v1::DeleteSessionRequest>(kGrpDoomed), &response)
              .ok());
    }
  }

  // A deadline, and the bearer token of the tenant the call is made for ("": none).
  static void Prepare(grpc::ClientContext* context, const std::string& token = kTokenA) {
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!token.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }

  // Runs `row`'s request; the status (for ObserveStream and a batch of one, the
  // item's status). `stream_response` receives the item's response, if any.
  grpc::Status Call(const Row& row, std::optional<v1::ObserveResponse>* stream_response,
                    std::string* stream_error) {
    grpc::ClientContext context;
    const char* holder = row.as_admin ? kAdminToken : row.as_tenant_b ? kTokenB : kTokenA;
    Prepare(&context, row.token.value_or(holder));
    switch (row.method) {
      case Method::kCompute: {
        v1::ComputeResponse response;
        return stub_->Compute(&context, std::get<v1::ComputeRequest>(row.request), &response);
      }
      case Method::kCreateSession: {
        v1::Session response;
        return stub_->CreateSession(&context, std::get<v1::CreateSessionRequest>(row.request),
                                    &response);
      }
      case Method::kGetSession: {
        v1::Session response;
        return stub_->GetSession(&context, std::get<v1::GetSessionRequest>(row.request), &response);
      }
      case Method::kListSessions: {
        v1::ListSessionsResponse response;
        return stub_->ListSessions(&context, std::get<v1::ListSessionsRequest>(row.request),
                                   &response);
      }
      case Method::kReadSessions: {
        std::unique_ptr<grpc::ClientReader<v1::Session>> reader =
            stub_->ReadSessions(&context, std::get<v1::ReadSessionsRequest>(row.request));
        v1::Session session;
        while (reader->Read(&session)) {
        }
        return reader->Finish();
      }
      case Method::kExportSessions: {
        std::unique_ptr<grpc::ClientReader<v1::ExportChunk>> reader =
            stub_->ExportSessions(&context, std::get<v1::ExportSessionsRequest>(row.request));
        v1::ExportChunk chunk;
        while (reader->Read(&chunk)) {
        }
        return reader->Finish();
      }
      case Method::kDeleteSession: {
        v1::DeleteSessionResponse response;
        return stub_->DeleteSession(&context, std::get<v1::DeleteSessionRequest>(row.request),
                                    &response);
      }
      case Method::kObserve: {
        v1::ObserveResponse response;
        return stub_->Observe(&context, std::get<v1::ObserveRequest>(row.request), &response);
      }
      case Method::kObserveStream: {
        auto stream = stub_->ObserveStream(&context);
        v1::ObserveResponse response;
        const bool wrote = stream->Write(std::get<v1::ObserveRequest>(row.request));
        const bool read = wrote && stream->Read(&response);
        stream->WritesDone();
        const grpc::Status finish = stream->Finish();
        if (!read || !finish.ok()) {
          *stream_error =
              absl::StrCat("the stream itself failed (wrote ", wrote, ", read ", read,
                           "): ", CodeName(finish.error_code()), ": ", finish.error_message());
          return finish.ok() ? grpc::Status(StatusCode::UNKNOWN, "no response") : finish;
        }
        *stream_response = response;
        return wire::ToGrpcStatus(wire::FromRpcStatus(response.status()));
      }
      case Method::kObserveBatch: {
        const auto& request = std::get<v1::ObserveBatchRequest>(row.request);
        v1::ObserveBatchResponse response;
        const grpc::Status status = stub_->ObserveBatch(&context, request, &response);
        if (!status.ok()) return status;
        if (response.responses_size() != request.observations_size()) {
          *stream_error = absl::StrCat("the batch answered ", response.responses_size(), " of ",
                                       request.observations_size(), " observations");
          return grpc::Status(StatusCode::UNKNOWN, "no response");
        }
        if (request.observations_size() != 1) {
          *stream_error = "a batch of more than one observation was answered";
          return grpc::Status::OK;
        }
        *stream_response = response.responses(0);
        return wire::ToGrpcStatus(wire::FromRpcStatus(response.responses(0).status()));
      }
      case Method::kGetQParams: {
        v1::GetQParamsResponse response;
        return stub_->GetQParams(&context, std::get<v1::GetQParamsRequest>(row.request), &response);
      }
      case Method::kGetHistogram: {
        v1::HistogramObservation response;
        return stub_->GetHistogram(&context, std::get<v1::GetHistogramRequest>(row.request),
                                   &response);
      }
      case Method::kSetExportMode: {
        v1::Session response;
        return stub_->SetExportMode(&context, std::get<v1::SetExportModeRequest>(row.request),
                                    &response);
      }
      case Method::kSetGranularity: {
        v1::Session response;
        return stub_->SetGranularity(&context, std::get<v1::SetGranularityRequest>(row.request),
                                     &response);
      }
      case Method::kCreateScaleGroup: {
        v1::ScaleGroup response;
        return stub_->CreateScaleGroup(&context, std::get<v1::CreateScaleGroupRequest>(row.request),
                                       &response);
      }
      case Method::kGetScaleGroup: {
        v1::ScaleGroup response;
        return stub_->GetScaleGroup(&context, std::get<v1::GetScaleGroupRequest>(row.request),
                                    &response);
      }
      case Method::kListScaleGroups: {
        v1::ListScaleGroupsResponse response;
        return stub_->ListScaleGroups(&context, std::get<v1::ListScaleGroupsRequest>(row.request),
                                      &response);
      }
      case Method::kDeleteScaleGroup: {
        v1::DeleteScaleGroupResponse response;
        return stub_->DeleteScaleGroup(&context, std::get<v1::DeleteScaleGroupRequest>(row.request),
                                       &response);
      }
      case Method::kGetGroupQParams: {
        v1::GroupQParams response;
        return stub_->GetGroupQParams(&context, std::get<v1::GetGroupQParamsRequest>(row.request),
                                      &response);
      }
      case Method::kSetSlotMap: {
        v1::Topology response;
        return admin_stub_->SetSlotMap(&context, std::get<v1::SetSlotMapRequest>(row.request),
                                       &response);
      }
    }
    return grpc::Status(StatusCode::INTERNAL, "unknown method");
  }

  // Every session and every group of both tenants, every field.
  struct Snapshot {
    v1::ListSessionsResponse sessions_a, sessions_b;
    v1::ListScaleGroupsResponse groups_a, groups_b;
  };
  Snapshot Store() {
    Snapshot snapshot;
    for (const auto& [token, sessions, groups] :
         {std::tuple{kTokenA, &snapshot.sessions_a, &snapshot.groups_a},
          std::tuple{kTokenB, &snapshot.sessions_b, &snapshot.groups_b}}) {
      grpc::ClientContext context;
      Prepare(&context, token);
      v1::ListSessionsRequest request;
      request.set_page_size(1000);
      const grpc::Status status = stub_->ListSessions(&context, request, sessions);
      EXPECT_TRUE(status.ok()) << status.error_message();
      grpc::ClientContext groups_context;
      Prepare(&groups_context, token);
      const grpc::Status listed =
          stub_->ListScaleGroups(&groups_context, ListGroupsReq(1000, "", ""), groups);
      EXPECT_TRUE(listed.ok()) << listed.error_message();
    }
    return snapshot;
  }

  void Create(const v1::CreateSessionRequest& request, const char* token = kTokenA) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::Session session;
    const grpc::Status status = stub_->CreateSession(&context, request, &session);
    ASSERT_TRUE(status.ok()) << request.name() << ": " << status.error_message();
  }
  void Observe(const v1::ObserveRequest& request, const char* token = kTokenA) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::ObserveResponse response;
    const grpc::Status status = stub_->Observe(&context, request, &response);
    ASSERT_TRUE(status.ok()) << request.name() << ": " << status.error_message();
  }
  std::string FirstPageToken(const std::string& filter) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ListSessionsResponse response;
    const grpc::Status status = stub_->ListSessions(&context, ListReq(1, "", filter), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(response.next_page_token().empty()) << filter;
    return response.next_page_token();
  }

  void CreateGroup(const v1::CreateScaleGroupRequest& request, const char* token = kTokenA) {
    grpc::ClientContext context;
    Prepare(&context, token);
    v1::ScaleGroup group;
    const grpc::Status status = stub_->CreateScaleGroup(&context, request, &group);
    ASSERT_TRUE(status.ok()) << request.group().name() << ": " << status.error_message();
  }
  std::string FirstGroupPageToken(const std::string& filter) {
    grpc::ClientContext context;
    Prepare(&context);
    v1::ListScaleGroupsResponse response;
    const grpc::Status status =
        stub_->ListScaleGroups(&context, ListGroupsReq(1, "", filter), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(response.next_page_token().empty()) << filter;
    return response.next_page_token();
  }

  std::string tokens_file_, admin_tokens_file_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
  std::unique_ptr<v1::ClusterAdmin::Stub> admin_stub_;  // SetSlotMap
  Tokens tokens_;
};

TEST_P(Hardening, FailsWithTheRightCodeNamesTheFieldAndChangesNothing) {
  const Snapshot before = Store();
  ASSERT_EQ(before.sessions_a.sessions_size(), 15);
  ASSERT_TRUE(before.sessions_a.next_page_token().empty());
  ASSERT_EQ(before.sessions_b.sessions_size(), 2);
  ASSERT_EQ(before.groups_a.groups_size() + before.groups_b.groups_size(), kGroups);
  ASSERT_EQ(before.groups_b.groups_size(), 1);
  const std::vector<Row> rows = BadRequests(tokens_);
  ASSERT_LT(GetParam(), static_cast<int>(rows.size()));
  const Row& row = rows[GetParam()];
  ASSERT_NE(row.code, StatusCode::OK) << row.what;
  SCOPED_TRACE(absl::StrCat(MethodName(row.method), " [", row.what, "]"));

  std::optional<v1::ObserveResponse> stream_response;
  std::string stream_error;
  const grpc::Status status = Call(row, &stream_response, &stream_error);
  const std::string actual =
      absl::StrCat("got ", CodeName(status.error_code()), ": \"", status.error_message(), "\"");
  EXPECT_TRUE(stream_error.empty()) << stream_error;
  EXPECT_EQ(status.error_code(), row.code) << "expected " << CodeName(row.code) << ", " << actual;
  EXPECT_TRUE(absl::StrContains(status.error_message(), row.field))
      << "the message does not name \"" << row.field << "\"; " << actual;
  if (stream_response.has_value()) {
    // A failed stream response carries the session's current count and no qparams.
    const std::string& name =
        row.method == Method::kObserveBatch
            ? std::get<v1::ObserveBatchRequest>(row.request).observations(0).name()
            : std::get<v1::ObserveRequest>(row.request).name();
    int64_t count = 0;
    for (const v1::Session& s : before.sessions_a.sessions()) {
      if (s.name() == name) count = s.observation_count();
    }
    EXPECT_EQ(stream_response->observation_count(), count) << actual;
    EXPECT_FALSE(stream_response->has_qparams()) << actual;
  }
  const Snapshot after = Store();
  for (const auto& [what, was, is] :
       {std::tuple<const char*, const google::protobuf::Message*, const google::protobuf::Message*>{
            "tenant A's sessions", &before.sessions_a, &after.sessions_a},
        {"tenant B's sessions", &before.sessions_b, &after.sessions_b},
        {"tenant A's groups", &before.groups_a, &after.groups_a},
        {"tenant B's groups", &before.groups_b, &after.groups_b}}) {
    std::string diff;
    google::protobuf::util::MessageDifferencer differencer;
    differencer.ReportDifferencesToString(&diff);
    EXPECT_TRUE(differencer.Compare(*was, *is)) << what << " changed (" << actual << "):\n" << diff;
  }
}

// The rows' names (the table needs no server to be listed): the method and what the
// row holds, in letters and digits, numbered so that each is unique. Built once: the
// instantiation asks for the count and then for each name.
std::vector<std::string> MakeRowNames() {
  std::vector<std::string> names;
  for (const Row& row : BadRequests(Tokens{})) {
    std::string name = absl::StrCat(names.size(), "_", MethodName(row.method), "_");
    bool gap = false;
    for (char c : row.what) {
      if (absl::ascii_isalnum(static_cast<unsigned char>(c))) {
        if (gap && name.back() != '_') name.push_back('_');
        name.push_back(c);
        gap = false;
      } else {
        gap = true;
      }
    }
    names.push_back(std::move(name));
  }
  return names;
}

const std::vector<std::string>& RowNames() {
  static const std::vector<std::string>* const names = new std::vector<std::string>(MakeRowNames());
  return *names;
}

INSTANTIATE_TEST_SUITE_P(BadRequest, Hardening,
                         ::testing::Range(0, static_cast<int>(RowNames().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return RowNames()[info.param];
                         });

TEST(HardeningTable, HasARowForEveryMethodAndEnoughOfThem) {
  const std::vector<Row> rows = BadRequests(Tokens{});
  EXPECT_GE(rows.size(), 180u);
  std::set<Method> methods;
  for (const Row& row : rows) methods.insert(row.method);
  EXPECT_EQ(methods.size(), 20u);  // every Method
}

}  // namespace
}  // namespace qparams::testing::bad_request
