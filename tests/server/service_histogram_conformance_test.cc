// The histogram conformance vectors (HistogramVectorsPath()) through the real gRPC
// service, bit for bit: every case in a session, four ways: Observe, Observe with
// omit_qparams (no search) followed by GetQParams, ObserveBatch (each observation a
// batch of one), and one ObserveStream shared by all cases. Tensors travel as tensors
// and histograms as HistogramObservations; the qparams and the calibration (amax by
// its bits, bin index, exponent, total count) must match, a failed step must leave
// the session (GetSession and GetHistogram) as it was, and the members of a group
// must end with identical histograms.

#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "proto/status.h"
#include "tests/server/service_test_util.h"
#include "tests/support/histogram_vectors.h"

namespace qparams::testing {
namespace {

enum class Mode { kObserve, kOmit, kBatch, kStream };

ObserveWay WayOf(Mode mode) {
  return mode == Mode::kStream  ? ObserveWay::kStream
         : mode == Mode::kBatch ? ObserveWay::kBatch
                                : ObserveWay::kObserve;
}

const char* ModeName(Mode mode) {
  switch (mode) {
    case Mode::kObserve:
      return "Observe";
    case Mode::kOmit:
      return "Observe with omit_qparams, then GetQParams";
    case Mode::kBatch:
      return "ObserveBatch";
    case Mode::kStream:
      return "ObserveStream";
  }
  return "?";
}

using Stream = ObserveStreamRW;

// The histogram parameters of a case on the wire; a nonfinite name the wire has no
// value for becomes an unknown enum value, which the service must refuse.
v1::HistogramParams ParamsToProto(const HistogramCase& c) {
  v1::HistogramParams params = wire::HistogramParamsToProto(*c.params);
  if (c.nonfinite.has_value()) {
    params.set_nonfinite(*c.nonfinite == "reject"   ? v1::NONFINITE_REJECT
                         : *c.nonfinite == "ignore" ? v1::NONFINITE_IGNORE
                                                    : static_cast<v1::NonFinitePolicy>(99));
  }
  return params;
}

// "" when the qparams and calibration a call returned match the step's expect.
std::string ResultDifference(const HistogramStep& step, const v1::QParams& qparams,
                             std::optional<bool> initialized, bool has_calibration,
                             const v1::CalibrationResult& calibration) {
  if (std::string d = FirstDifference(*step.expect, wire::QParamsFromProto(qparams), initialized);
      !d.empty()) {
    return d;
  }
  const ExpectedCalibration& expected = *step.expect_calibration;
  if (has_calibration != expected.amax_bits.has_value()) {
    return absl::StrCat("calibration: expected ", expected.amax_bits ? "a result" : "none",
                        ", got ", has_calibration ? "a result" : "none");
  }
  if (!has_calibration) return "";
  uint64_t bits;
  const double amax = calibration.amax();
  std::memcpy(&bits, &amax, sizeof bits);
  if (bits != *expected.amax_bits) {
    double want;
    std::memcpy(&want, &*expected.amax_bits, sizeof want);
    return absl::StrFormat("calibration.amax: expected %a, got %a", want, amax);
  }
  if (calibration.bin_index() != expected.bin_index) {
    return absl::StrCat("calibration.bin_index: expected ", expected.bin_index.value_or(-1),
                        ", got ", calibration.bin_index());
  }
  if (calibration.exponent() != expected.exponent) {
    return absl::StrCat("calibration.exponent: expected ", expected.exponent, ", got ",
                        calibration.exponent());
  }
  if (calibration.total_count() != expected.total_count) {
    return absl::StrCat("calibration.total_count: expected ", expected.total_count, ", got ",
                        calibration.total_count());
  }
  return "";
}

class ServiceHistogramConformance : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::vector<HistogramCase>> cases = LoadHistogramVectors(HistogramVectorsPath());
    ASSERT_TRUE(cases.ok()) << cases.status();
    ASSERT_FALSE(cases->empty()) << HistogramVectorsPath() << " holds no cases";
    cases_ = new std::vector<HistogramCase>(*std::move(cases));
  }
  static void TearDownTestSuite() { delete cases_; }

  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    stub_ = server_->NewStub();
  }

  // Runs one case through a session; "" on success, else what differed. `final`
  // receives the histogram the session ends with.
  std::string RunCase(const HistogramCase& c, const std::string& name, Mode mode, Stream* stream,
                      std::optional<Histogram>* final);

  // What a failed step must not change: the session and its histogram.
  std::string Snapshot(const std::string& name);

  // GetHistogram's status and reply.
  std::pair<grpc::Status, v1::HistogramObservation> ReadHistogram(const std::string& name) {
    grpc::ClientContext context;
    v1::GetHistogramRequest request;
    request.set_name(name);
    v1::HistogramObservation histogram;
    const grpc::Status status = stub_->GetHistogram(&context, request, &histogram);
    return {status, histogram};
  }

  static std::vector<HistogramCase>* cases_;
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<v1::QParamsService::Stub> stub_;
};

std::vector<HistogramCase>* ServiceHistogramConformance::cases_ = nullptr;

std::string ServiceHistogramConformance::Snapshot(const std::string& name) {
  grpc::ClientContext session_context;
  v1::GetSessionRequest get;
  get.set_name(name);
  v1::Session session;
  const grpc::Status got = stub_->GetSession(&session_context, get, &session);
  const auto [got_histogram, histogram] = ReadHistogram(name);
  if (!got.ok() || !got_histogram.ok()) return "(the session could not be read)";
  return session.SerializeAsString() + histogram.SerializeAsString();
}

std::string ServiceHistogramConformance::RunCase(const HistogramCase& c, const std::string& name,
                                                 Mode mode, Stream* stream,
                                                 std::optional<Histogram>* final) {
  v1::CreateSessionRequest create;
  create.set_name(name);
  create.set_calculator(c.calculator);
  *create.mutable_spec() = wire::SpecToProto(c.spec);
  if (c.params.has_value()) *create.mutable_histogram() = ParamsToProto(c);
  grpc::ClientContext create_context;
  v1::Session session;
  const grpc::Status created = stub_->CreateSession(&create_context, create, &session);
  if (c.construct_error.has_value()) {
    const absl::StatusCode code = wire::FromGrpcStatus(created).code();
    if (code == *c.construct_error) return "";
    return absl::StrCat("CreateSession: expected ", CodeName(*c.construct_error), ", got ",
                        code == absl::StatusCode::kOk ? "ok" : CodeName(code));
  }
  if (!created.ok()) return absl::StrCat("CreateSession failed: ", created.error_message());

  for (size_t i = 0; i < c.steps.size(); ++i) {
    const HistogramStep& step = c.steps[i];
    const std::string where = absl::StrCat("step ", i, " ");
    const std::string before = step.expect_error.has_value() ? Snapshot(name) : "";
    grpc::Status status;
    std::string diff;  // of the result, once the status is judged

    switch (step.op) {
      case HistogramStep::Op::kForward:
      case HistogramStep::Op::kObserveHistogram: {
        v1::ObserveRequest request;
        request.set_name(name);
        if (step.op == HistogramStep::Op::kForward) {
          *request.mutable_tensor() = wire::TensorToProto(step.input.view());
        } else {
          *request.mutable_histogram() = wire::HistogramToProto(step.histogram);
        }
        request.set_omit_qparams(mode == Mode::kOmit);
        const Observed observed = ObserveOnce(*stub_, WayOf(mode), stream, request);
        status = observed.status;
        const v1::ObserveResponse& response = observed.response;
        if (!status.ok() || !step.expect.has_value()) break;
        if (mode != Mode::kOmit) {
          // An observation's response has no initialized flag: a histogram session
          // answers with a calibration exactly when it holds a finite value (the
          // Omit mode checks GetQParams' flag).
          diff = ResultDifference(step, response.qparams(), response.has_calibration(),
                                  response.has_calibration(), response.calibration());
          break;
        }
        if (response.has_qparams() || response.has_calibration()) {
          diff = "omit_qparams: the response carries qparams or a calibration";
          break;
        }
        [[fallthrough]];  // the result of an observation that omitted it, read back
      }
      case HistogramStep::Op::kGetQParams: {
        grpc::ClientContext context;
        v1::GetQParamsRequest request;
        request.set_name(name);
        v1::GetQParamsResponse response;
        status = stub_->GetQParams(&context, request, &response);
        if (status.ok() && step.expect.has_value()) {
          diff = ResultDifference(step, response.qparams(), response.initialized(),
                                  response.has_calibration(), response.calibration());
        }
        break;
      }
      case HistogramStep::Op::kGetHistogram: {
        v1::HistogramObservation response;
        std::tie(status, response) = ReadHistogram(name);
        if (status.ok() && step.expect_histogram.has_value()) {
          if (std::string d =
                  HistogramDifference(*step.expect_histogram, wire::HistogramFromProto(response));
              !d.empty()) {
            diff = absl::StrCat("histogram ", d);
          }
        }
        break;
      }
      case HistogramStep::Op::kSetExportMode:
        status = SetExportMode(*stub_, name, step.enabled);
        break;
      case HistogramStep::Op::kSetGranularity:
        status = SetGranularity(*stub_, name, step.granularity);
        break;
    }

    if (step.expect_error.has_value()) {
      if (std::string d = ErrorStepDifference(*step.expect_error, wire::FromGrpcStatus(status),
                                              Snapshot(name) == before);
          !d.empty()) {
        return absl::StrCat(where, "(rule ", step.rule, ") ", d);
      }
      continue;
    }
    if (!status.ok()) {
      return absl::StrCat(where, "status: expected ok, got ",
                          CodeName(wire::FromGrpcStatus(status).code()), " ",
                          status.error_message());
    }
    if (!diff.empty()) return where + diff;
  }

  const auto [read, histogram] = ReadHistogram(name);
  if (!read.ok()) return "GetHistogram failed at the end";
  *final = wire::HistogramFromProto(histogram);
  if (!DeleteSession(*stub_, name).ok()) return "DeleteSession failed";
  return "";
}

TEST_F(ServiceHistogramConformance, EveryCaseFourWays) {
  grpc::ClientContext stream_context;
  std::unique_ptr<Stream> stream = stub_->ObserveStream(&stream_context);
  int failed = 0;
  // group -> its first member's id and final histogram, per mode
  std::map<std::pair<std::string, Mode>, std::pair<std::string, Histogram>> groups;
  for (size_t i = 0; i < cases_->size(); ++i) {
    const HistogramCase& c = (*cases_)[i];
    std::string diff;
    for (Mode mode : {Mode::kObserve, Mode::kOmit, Mode::kBatch, Mode::kStream}) {
      std::optional<Histogram> final;
      diff = RunCase(c, absl::StrCat("hist/", static_cast<int>(mode), "/", i), mode, stream.get(),
                     &final);
      if (diff.empty() && !c.group.empty() && final.has_value()) {
        auto [it, first] = groups.try_emplace({c.group, mode}, c.id, *final);
        if (!first) {
          if (std::string d = HistogramDifference(it->second.second, *final); !d.empty()) {
            diff = absl::StrCat("group ", c.group, ": the histogram differs from that of ",
                                it->second.first, ": ", d);
          }
        }
      }
      if (!diff.empty()) {
        diff = absl::StrCat("(", ModeName(mode), ") ", diff);
        break;
      }
    }
    if (diff.empty()) continue;
    ++failed;
    ADD_FAILURE() << "case " << c.id << ": " << diff;
  }
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  std::cout << "histogram conformance: " << cases_->size() - failed << " of " << cases_->size()
            << " cases match\n";
}

}  // namespace
}  // namespace qparams::testing
