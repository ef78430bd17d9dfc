// The conformance vectors (VectorsPath()) through the service, bit for bit: every
// single-forward case of a stateless-capable calculator through Compute, and every
// case through a session, four ways: Observe with tensors, Observe with block
// ranges reduced by the client, one ObserveStream shared by all cases, and
// ObserveBatch (each forward a batch of one). The session cases of the NVFP4 vectors
// (Nvfp4VectorsPath(), nvfp4.md §10) run the same ways.

#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/range.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "tests/server/service_test_util.h"
#include "tests/support/conformance_vectors.h"

namespace qparams::testing {
namespace {

enum class Mode { kTensor, kRange, kStream, kBatch };

std::string Describe(absl::StatusCode code) { return code == absl::StatusCode::kOk ? "ok" : CodeName(code); }

// Compares a call's outcome with a step's expectation; "" when they agree.
std::string Judge(const VectorStep& step, const grpc::Status& status,
                  const std::optional<QParams>& qparams, std::optional<bool> initialized) {
  const auto code = wire::FromGrpcStatus(status).code();
  if (step.expect_error.has_value()) {
    if (code == *step.expect_error) return "";
    return absl::StrCat("status: expected ", CodeName(*step.expect_error), ", got ",
                        Describe(code), " ", status.error_message());
  }
  if (!status.ok()) {
    return absl::StrCat("status: expected ok, got ", Describe(code), " ", status.error_message());
  }
  if (step.expect.has_value()) {
    if (!qparams.has_value()) return "no qparams to compare";
    return FirstDifference(*step.expect, *qparams, initialized);
  }
  return "";
}

// Whether Compute runs case `c` (a dynamic or static one): its construction error,
// its one forward, or (dynamic, which keeps no state) each of its forwards.
bool RunsThroughCompute(const VectorCase& c) {
  if (c.calculator != "dynamic" && c.calculator != "static") return false;
  if (c.construct_error.has_value()) return true;
  if (c.steps.size() == 1) return c.steps[0].op == VectorStep::Op::kForward;
  if (c.calculator != "dynamic" || c.steps.empty()) return false;
  for (const VectorStep& step : c.steps) {
    if (step.op != VectorStep::Op::kForward) return false;
  }
  return true;
}

// Runs a case RunsThroughCompute accepts through Compute, one call per forward; ""
// on success, else what differed.
std::string RunCompute(v1::QParamsService::Stub& stub, const VectorCase& c) {
  v1::ComputeRequest request;
  request.set_calculator(c.calculator);
  *request.mutable_spec() = wire::SpecToProto(c.spec);
  if (c.construct_error.has_value()) {
    *request.mutable_tensor() = wire::TensorToProto(
        TensorView::Create(DType::kFloat32, {1}, std::string(4, '\0')).value());
    grpc::ClientContext context;
    v1::ComputeResponse response;
    grpc::Status status = stub.Compute(&context, request, &response);
    VectorStep step;
    step.expect_error = c.construct_error;
    return Judge(step, status, std::nullopt, std::nullopt);
  }
  for (size_t i = 0; i < c.steps.size(); ++i) {
    const VectorStep& step = c.steps[i];
    *request.mutable_tensor() = wire::TensorToProto(step.input.view());
    grpc::ClientContext context;
    v1::ComputeResponse response;
    grpc::Status status = stub.Compute(&context, request, &response);
    if (std::string d =
            Judge(step, status, wire::QParamsFromProto(response.qparams()), std::nullopt);
        !d.empty()) {
      return c.steps.size() == 1 ? d : absl::StrCat("step ", i, " ", d);
    }
  }
  return "";
}

// Runs one case through a session named `name`, `mode` (kStream on the open
// `stream`); "" on success, else what differed. A failed step must leave the
// session as it was.
std::string RunSession(v1::QParamsService::Stub& stub, const VectorCase& c, const std::string& name,
                       Mode mode, ObserveStreamRW* stream) {
  v1::CreateSessionRequest create;
  create.set_name(name);
  create.set_calculator(c.calculator);
  *create.mutable_spec() = wire::SpecToProto(c.spec);
  if (c.averaging_constant) create.set_averaging_constant(*c.averaging_constant);
  grpc::ClientContext create_context;
  v1::Session session;
  grpc::Status created = stub.CreateSession(&create_context, create, &session);
  if (c.construct_error.has_value() || c.calculator == "dynamic") {
    // Sessions refuse the stateless calculator as they refuse a bad spec.
    if (created.error_code() == grpc::StatusCode::INVALID_ARGUMENT) return "";
    return absl::StrCat("CreateSession: expected invalid_argument, got ",
                        Describe(wire::FromGrpcStatus(created).code()));
  }
  if (!created.ok()) return absl::StrCat("CreateSession failed: ", created.error_message());

  for (size_t i = 0; i < c.steps.size(); ++i) {
    const VectorStep& step = c.steps[i];
    const std::string where = absl::StrCat("step ", i, " ");
    grpc::ClientContext before_context;
    v1::GetSessionRequest get;
    get.set_name(name);
    v1::Session before;
    if (!stub.GetSession(&before_context, get, &before).ok()) return where + "GetSession failed";

    grpc::Status status;
    std::optional<QParams> qparams;
    std::optional<bool> initialized;
    switch (step.op) {
      case VectorStep::Op::kForward: {
        v1::ObserveRequest request;
        request.set_name(name);
        *request.mutable_tensor() = wire::TensorToProto(step.input.view());
        if (mode == Mode::kRange) {
          // Reduce as a client would, with the session's current granularity.
          absl::StatusOr<Granularity> g =
              wire::GranularityFromProto(before.spec().granularity(), "granularity");
          absl::StatusOr<Shape> block =
              g.ok() ? g->BlockShape(step.input.shape,
                                     wire::TargetFromProto(before.spec().target()))
                     : g.status();
          absl::StatusOr<BlockRange> range =
              block.ok() ? ObserveRange(step.input.view(), *block) : block.status();
          if (range.ok()) {
            v1::RangeObservation* r = request.mutable_range();
            r->mutable_input_shape()->Assign(step.input.shape.begin(), step.input.shape.end());
            *r->mutable_min() = wire::TensorToProto(range->min.view());
            *r->mutable_max() = wire::TensorToProto(range->max.view());
          }
        }
        const ObserveWay way = mode == Mode::kStream  ? ObserveWay::kStream
                               : mode == Mode::kBatch ? ObserveWay::kBatch
                                                      : ObserveWay::kObserve;
        const Observed observed = ObserveOnce(stub, way, stream, request);
        status = observed.status;
        if (status.ok()) qparams = wire::QParamsFromProto(observed.response.qparams());
        break;
      }
      case VectorStep::Op::kGetQParams: {
        grpc::ClientContext context;
        v1::GetQParamsRequest request;
        request.set_name(name);
        v1::GetQParamsResponse response;
        status = stub.GetQParams(&context, request, &response);
        qparams = wire::QParamsFromProto(response.qparams());
        initialized = response.initialized();
        break;
      }
      case VectorStep::Op::kSetExportMode:
        status = SetExportMode(stub, name, step.enabled);
        break;
      case VectorStep::Op::kSetGranularity:
        status = SetGranularity(stub, name, step.granularity);
        break;
    }
    if (std::string d = Judge(step, status, qparams, initialized); !d.empty()) return where + d;
    if (!status.ok()) {
      grpc::ClientContext after_context;
      v1::Session after;
      if (!stub.GetSession(&after_context, get, &after).ok()) return where + "GetSession failed";
      if (before.SerializeAsString() != after.SerializeAsString()) {
        return where + "state: a failed step changed the session";
      }
    }
  }
  if (!DeleteSession(stub, name).ok()) return "DeleteSession failed";
  return "";
}

// A server and a stub to run the cases of `path` through; the cases are read once
// per suite.
class VectorsThroughTheService : public ::testing::Test {
 protected:
  static std::vector<VectorCase>* Load(const std::string& path) {
    absl::StatusOr<std::vector<VectorCase>> cases = LoadVectors(path);
    EXPECT_TRUE(cases.ok()) << cases.status();
    if (!cases.ok()) return new std::vector<VectorCase>();
    EXPECT_FALSE(cases->empty()) << path << " holds no cases";
    return new std::vector<VectorCase>(*std::move(cases));
  }

  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
};

class ServiceConformance : public VectorsThroughTheService {
 protected:
  static void SetUpTestSuite() { cases_ = Load(VectorsPath()); }
  static void TearDownTestSuite() { delete cases_; }

  static std::vector<VectorCase>* cases_;
};

std::vector<VectorCase>* ServiceConformance::cases_ = nullptr;

TEST_F(ServiceConformance, SingleForwardCasesThroughCompute) {
  int run = 0, failed = 0;
  for (const VectorCase& c : *cases_) {
    if (!RunsThroughCompute(c)) continue;
    if (!c.construct_error.has_value() && c.steps.size() != 1) continue;  // single forwards
    ++run;
    if (std::string d = RunCompute(*stub_, c); !d.empty()) {
      ++failed;
      ADD_FAILURE() << "case " << c.id << " (Compute): " << d;
    }
  }
  std::cout << "conformance via Compute: " << run - failed << " of " << run << " cases match\n";
  EXPECT_GT(run, 0);
}

TEST_F(ServiceConformance, EveryCaseThroughSessions) {
  for (Mode mode : {Mode::kTensor, Mode::kRange, Mode::kBatch}) {
    const char* way = mode == Mode::kRange   ? "Observe (block ranges)"
                      : mode == Mode::kBatch ? "ObserveBatch"
                                             : "Observe";
    int failed = 0;
    for (size_t i = 0; i < cases_->size(); ++i) {
      const VectorCase& c = (*cases_)[i];
      if (std::string d = RunSession(*stub_, c, absl::StrCat("case/", i), mode, nullptr);
          !d.empty()) {
        ++failed;
        ADD_FAILURE() << "case " << c.id << " (" << way << "): " << d;
      }
    }
    std::cout << "conformance via " << way << ": " << cases_->size() - failed << " of "
              << cases_->size() << " cases match\n";
  }
}

TEST_F(ServiceConformance, EveryCaseThroughOneStream) {
  grpc::ClientContext context;
  auto stream = stub_->ObserveStream(&context);
  int failed = 0;
  for (size_t i = 0; i < cases_->size(); ++i) {
    const VectorCase& c = (*cases_)[i];
    if (std::string d =
            RunSession(*stub_, c, absl::StrCat("stream/", i), Mode::kStream, stream.get());
        !d.empty()) {
      ++failed;
      ADD_FAILURE() << "case " << c.id << " (ObserveStream): " << d;
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  std::cout << "conformance via one ObserveStream: " << cases_->size() - failed << " of "
            << cases_->size() << " cases match\n";
}

// The NVFP4 vectors' session cases (those the core runs), every way at once: a case
// matches when Compute (where RunsThroughCompute), Observe with tensors and with
// block ranges, ObserveBatch and one ObserveStream shared by all cases each match.
// The group cases need scale groups (nvfp4.md §4) and the qdq cases check the client
// side (§5): both are counted apart.
// The group cases' driver: every name of the case under `prefix`, which the results
// lose again, so that cases share the server without meeting.
class ServiceDriver final : public GroupCaseDriver {
 public:
  ServiceDriver(v1::QParamsService::Stub& stub, std::string prefix)
      : stub_(stub), prefix_(std::move(prefix)) {}

  absl::Status CreateSession(const std::string& name, const std::string& calculator,
                             const QuantSpec& spec,
                             std::optional<double> averaging_constant) override {
    v1::CreateSessionRequest request;
    request.set_name(prefix_ + name);
    request.set_calculator(calculator);
    *request.mutable_spec() = wire::SpecToProto(spec);
    if (averaging_constant) request.set_averaging_constant(*averaging_constant);
    grpc::ClientContext context;
    v1::Session session;
    return wire::FromGrpcStatus(stub_.CreateSession(&context, request, &session));
  }
  absl::StatusOr<QParams> Forward(const std::string& session, const Tensor& input) override {
    v1::ObserveRequest request;
    request.set_name(prefix_ + session);
    *request.mutable_tensor() = wire::TensorToProto(input.view());
    grpc::ClientContext context;
    v1::ObserveResponse response;
    if (grpc::Status s = stub_.Observe(&context, request, &response); !s.ok()) {
      return wire::FromGrpcStatus(s);
    }
    return wire::QParamsFromProto(response.qparams());
  }
  absl::StatusOr<std::pair<QParams, bool>> GetQParams(const std::string& session) override {
    v1::GetQParamsRequest request;
    request.set_name(prefix_ + session);
    grpc::ClientContext context;
    v1::GetQParamsResponse response;
    if (grpc::Status s = stub_.GetQParams(&context, request, &response); !s.ok()) {
      return wire::FromGrpcStatus(s);
    }
    return std::pair{wire::QParamsFromProto(response.qparams()), response.initialized()};
  }
  absl::Status SetGranularity(const std::string& session, const Granularity& g) override {
    v1::SetGranularityRequest request;
    request.set_name(prefix_ + session);
    *request.mutable_granularity() = wire::GranularityToProto(g);
    grpc::ClientContext context;
    v1::Session response;
    return wire::FromGrpcStatus(stub_.SetGranularity(&context, request, &response));
  }
  absl::Status CreateGroup(const std::string& group, const std::vector<std::string>& members,
                           GroupShare share, bool fill_uncalibrated) override {
    v1::CreateScaleGroupRequest request;
    request.mutable_group()->set_name(prefix_ + group);
    for (const std::string& m : members) request.mutable_group()->add_members(prefix_ + m);
    request.mutable_group()->set_share(wire::GroupShareToProto(share));
    request.mutable_group()->set_fill_uncalibrated(fill_uncalibrated);
    grpc::ClientContext context;
    v1::ScaleGroup response;
    return wire::FromGrpcStatus(stub_.CreateScaleGroup(&context, request, &response));
  }
  absl::StatusOr<GroupResult> GetGroupQParams(const std::string& group) override {
    v1::GetGroupQParamsRequest request;
    request.set_name(prefix_ + group);
    grpc::ClientContext context;
    v1::GroupQParams response;
    if (grpc::Status s = stub_.GetGroupQParams(&context, request, &response); !s.ok()) {
      return wire::FromGrpcStatus(s);
    }
    GroupResult result = wire::GroupResultFromProto(response);
    for (std::string& name : result.uncalibrated) name = Unprefixed(name);
    for (GroupMemberResult& m : result.members) m.name = Unprefixed(m.name);
    return result;
  }
  std::string StateFingerprint() override {
    std::string out;
    v1::ListSessionsRequest sessions;
    sessions.set_filter(prefix_);
    sessions.set_page_size(1000);
    grpc::ClientContext sessions_context;
    v1::ListSessionsResponse listed;
    if (!stub_.ListSessions(&sessions_context, sessions, &listed).ok()) return "ListSessions failed";
    for (v1::Session& session : *listed.mutable_sessions()) {
      session.clear_update_time();
      out += session.SerializeAsString();
    }
    v1::ListScaleGroupsRequest groups;
    groups.set_filter(prefix_);
    groups.set_page_size(1000);
    grpc::ClientContext groups_context;
    v1::ListScaleGroupsResponse listed_groups;
    if (!stub_.ListScaleGroups(&groups_context, groups, &listed_groups).ok()) {
      return "ListScaleGroups failed";
    }
    return out + listed_groups.SerializeAsString();
  }

 private:
  std::string Unprefixed(const std::string& name) const {
    return name.substr(0, prefix_.size()) == prefix_ ? name.substr(prefix_.size()) : name;
  }

  v1::QParamsService::Stub& stub_;
  const std::string prefix_;
};

class ServiceNvfp4Conformance : public VectorsThroughTheService {
 protected:
  static void SetUpTestSuite() { cases_ = Load(Nvfp4VectorsPath()); }
  static void TearDownTestSuite() { delete cases_; }
  static std::vector<VectorCase>* cases_;
};

std::vector<VectorCase>* ServiceNvfp4Conformance::cases_ = nullptr;

TEST_F(ServiceNvfp4Conformance, EverySessionAndGroupCaseMatchesEveryWay) {
  grpc::ClientContext context;
  auto stream = stub_->ObserveStream(&context);
  int run = 0, failed = 0;
  std::map<std::string, int> not_run;  // by kind
  for (size_t i = 0; i < cases_->size(); ++i) {
    const VectorCase& c = (*cases_)[i];
    if (c.kind == "group") {
      ++run;
      ServiceDriver driver(*stub_, absl::StrCat("nvfp4-group/", i, "/"));
      if (const std::string diff = RunGroupCase(c.json, driver); !diff.empty()) {
        ++failed;
        ADD_FAILURE() << "case " << c.id << " (" << diff << ")";
      }
      continue;
    }
    if (!c.kind.empty()) {
      ++not_run[c.kind];
      continue;
    }
    ++run;
    std::string diff;
    if (RunsThroughCompute(c)) {
      if (std::string d = RunCompute(*stub_, c); !d.empty()) diff = "Compute: " + d;
    }
    for (Mode mode : {Mode::kTensor, Mode::kRange, Mode::kBatch, Mode::kStream}) {
      if (!diff.empty()) break;
      const char* way = mode == Mode::kRange    ? "Observe (block ranges)"
                        : mode == Mode::kBatch  ? "ObserveBatch"
                        : mode == Mode::kStream ? "ObserveStream"
                                                : "Observe";
      const std::string name = absl::StrCat("nvfp4/", static_cast<int>(mode), "/", i);
      if (std::string d = RunSession(*stub_, c, name, mode, stream.get()); !d.empty()) {
        diff = absl::StrCat(way, ": ", d);
      }
    }
    if (!diff.empty()) {
      ++failed;
      ADD_FAILURE() << "case " << c.id << " (" << diff << ")";
    }
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  std::cout << "nvfp4 conformance: " << run - failed << " of " << run << " cases match\n";
  std::vector<std::string> counts;
  for (const auto& [kind, count] : not_run) counts.push_back(absl::StrCat(count, " ", kind));
  if (!counts.empty()) {
    std::cout << "nvfp4 conformance: " << absl::StrJoin(counts, " and ")
              << " cases not run through the service (" << Nvfp4VectorsPath() << ")\n";
  }
  EXPECT_GT(run, 0);
}

}  // namespace
}  // namespace qparams::testing
