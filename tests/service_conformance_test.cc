// The conformance vectors (VectorsPath()) through the service, bit for bit: every
// single-forward case of a stateless-capable calculator through Compute, and every
// case through a session, four ways: Observe with tensors, Observe with block
// ranges reduced by the client, one ObserveStream shared by all cases, and
// ObserveBatch (each forward a batch of one).

#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/range.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "tests/conformance_vectors.h"
#include "tests/service_test_util.h"

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

class ServiceConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::vector<VectorCase>> cases = LoadVectors(VectorsPath());
    ASSERT_TRUE(cases.ok()) << cases.status();
    ASSERT_FALSE(cases->empty());
    cases_ = new std::vector<VectorCase>(*std::move(cases));
  }
  static void TearDownTestSuite() { delete cases_; }

  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
  }

  // Runs one case through a session; "" on success, else what differed.
  std::string RunSession(const VectorCase& c, const std::string& name, Mode mode,
                         grpc::ClientReaderWriter<v1::ObserveRequest, v1::ObserveResponse>* stream);

  // Every single-forward case of dynamic/static through Compute.
  std::string RunCompute(const VectorCase& c);

  static std::vector<VectorCase>* cases_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
};

std::vector<VectorCase>* ServiceConformance::cases_ = nullptr;

std::string ServiceConformance::RunCompute(const VectorCase& c) {
  v1::ComputeRequest request;
  request.set_calculator(c.calculator);
  *request.mutable_spec() = wire::SpecToProto(c.spec);
  if (c.construct_error.has_value()) {
    *request.mutable_tensor() = wire::TensorToProto(
        TensorView::Create(DType::kFloat32, {1}, std::string(4, '\0')).value());
    grpc::ClientContext context;
    v1::ComputeResponse response;
    grpc::Status status = stub_->Compute(&context, request, &response);
    VectorStep step;
    step.expect_error = c.construct_error;
    return Judge(step, status, std::nullopt, std::nullopt);
  }
  const VectorStep& step = c.steps[0];
  *request.mutable_tensor() = wire::TensorToProto(step.input.view());
  grpc::ClientContext context;
  v1::ComputeResponse response;
  grpc::Status status = stub_->Compute(&context, request, &response);
  return Judge(step, status, wire::QParamsFromProto(response.qparams()), std::nullopt);
}

std::string ServiceConformance::RunSession(
    const VectorCase& c, const std::string& name, Mode mode,
    grpc::ClientReaderWriter<v1::ObserveRequest, v1::ObserveResponse>* stream) {
  v1::CreateSessionRequest create;
  create.set_name(name);
  create.set_calculator(c.calculator);
  *create.mutable_spec() = wire::SpecToProto(c.spec);
  if (c.averaging_constant) create.set_averaging_constant(*c.averaging_constant);
  grpc::ClientContext create_context;
  v1::Session session;
  grpc::Status created = stub_->CreateSession(&create_context, create, &session);
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
    if (!stub_->GetSession(&before_context, get, &before).ok()) return where + "GetSession failed";

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
        const Observed observed = ObserveOnce(*stub_, way, stream, request);
        status = observed.status;
        if (status.ok()) qparams = wire::QParamsFromProto(observed.response.qparams());
        break;
      }
      case VectorStep::Op::kGetQParams: {
        grpc::ClientContext context;
        v1::GetQParamsRequest request;
        request.set_name(name);
        v1::GetQParamsResponse response;
        status = stub_->GetQParams(&context, request, &response);
        qparams = wire::QParamsFromProto(response.qparams());
        initialized = response.initialized();
        break;
      }
      case VectorStep::Op::kSetExportMode:
        status = SetExportMode(*stub_, name, step.enabled);
        break;
      case VectorStep::Op::kSetGranularity:
        status = SetGranularity(*stub_, name, step.granularity);
        break;
    }
    if (std::string d = Judge(step, status, qparams, initialized); !d.empty()) return where + d;
    if (!status.ok()) {
      grpc::ClientContext after_context;
      v1::Session after;
      if (!stub_->GetSession(&after_context, get, &after).ok()) return where + "GetSession failed";
      if (before.SerializeAsString() != after.SerializeAsString()) {
        return where + "state: a failed step changed the session";
      }
    }
  }
  if (!DeleteSession(*stub_, name).ok()) return "DeleteSession failed";
  return "";
}

TEST_F(ServiceConformance, SingleForwardCasesThroughCompute) {
  int run = 0, failed = 0;
  for (const VectorCase& c : *cases_) {
    if (c.calculator != "dynamic" && c.calculator != "static") continue;
    const bool single = c.construct_error.has_value() ||
                        (c.steps.size() == 1 && c.steps[0].op == VectorStep::Op::kForward);
    if (!single) continue;
    ++run;
    if (std::string d = RunCompute(c); !d.empty()) {
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
      if (std::string d = RunSession(c, absl::StrCat("case/", i), mode, nullptr); !d.empty()) {
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
    if (std::string d = RunSession(c, absl::StrCat("stream/", i), Mode::kStream, stream.get());
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

}  // namespace
}  // namespace qparams::testing
