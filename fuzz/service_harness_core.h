// The core of the in-process service harness (service_harness.h): a
// QParamsServiceImpl over an Engine, its unary methods called without gRPC's
// transport (each on a test CallbackServerContext whose default reactor records the
// status it finishes with: grpcpp/test/default_reactor_test_peer.h), failure
// reporting, the framing of multi-message inputs, and the invariants of responses
// (the contract rules of shared/docs/api.md) the request handlers check.

#ifndef QPARAMS_FUZZ_SERVICE_HARNESS_CORE_H_
#define QPARAMS_FUZZ_SERVICE_HARNESS_CORE_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "domain/engine.h"
#include "google/protobuf/stubs/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/test/default_reactor_test_peer.h"
#include "proto/convert.h"
#include "qparams/v1/qparams.pb.h"
#include "server/qparams_service.h"

namespace qparams::fuzz {

using google::protobuf::util::MessageDifferencer;

constexpr int64_t kMaxSessions = 32;
constexpr int64_t kMaxScaleGroups = 16;
constexpr int64_t kMaxTensorElements = int64_t{1} << 16;

// ---- Failure reporting ----

// Called before a contract violation traps (fuzz_requests writes its history).
inline void (*on_failure)() = nullptr;

[[noreturn]] inline void Fail(const std::string& what, const google::protobuf::Message* message) {
  std::fprintf(stderr, "fuzz: contract violated: %s\n", what.c_str());
  if (message != nullptr) std::fprintf(stderr, "%s\n", message->DebugString().c_str());
  if (on_failure != nullptr) on_failure();
  __builtin_trap();
}

inline void Check(bool ok, const std::string& what,
                  const google::protobuf::Message* message = nullptr) {
  if (!ok) Fail(what, message);
}

// Protobuf logs every string field with invalid UTF-8 it parses; fuzz inputs are
// full of them.
inline void QuietProtobufLogs() {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
}

// ---- Framing ----

// Inputs made of several messages: records of [tag byte][uint32 LE length][bytes].
inline std::string EncodeFrames(const std::vector<std::pair<uint8_t, std::string>>& frames) {
  std::string out;
  for (const auto& [tag, bytes] : frames) {
    out.push_back(static_cast<char>(tag));
    const uint32_t n = static_cast<uint32_t>(bytes.size());
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
    out += bytes;
  }
  return out;
}

// The frames of data[0, size); a short last length takes what is left.
inline std::vector<std::pair<uint8_t, std::string_view>> DecodeFrames(const uint8_t* data,
                                                                      size_t size) {
  std::vector<std::pair<uint8_t, std::string_view>> frames;
  size_t at = 0;
  while (at + 5 <= size) {
    const uint8_t tag = data[at];
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= uint32_t{data[at + 1 + i]} << (8 * i);
    at += 5;
    if (n > size - at) n = static_cast<uint32_t>(size - at);
    frames.emplace_back(tag, std::string_view(reinterpret_cast<const char*>(data + at), n));
    at += n;
  }
  return frames;
}

// ---- The service under test ----

struct Service {
  Engine engine;
  QParamsServiceImpl service;

  static EngineOptions MakeEngineOptions() {
    EngineOptions options;
    options.max_sessions = kMaxSessions;
    options.max_scale_groups = kMaxScaleGroups;
    return options;
  }
  static ServiceOptions MakeServiceOptions() {
    ServiceOptions options;
    options.max_tensor_elements = kMaxTensorElements;
    options.log_failed_rpcs = false;
    return options;
  }
  Service() : engine(MakeEngineOptions()), service(&engine, MakeServiceOptions()) {}
};

// Calls a unary method as gRPC's callback server would, and returns the status the
// handler finished with.
template <typename Request, typename Response>
grpc::Status Call(QParamsServiceImpl& service,
                  grpc::ServerUnaryReactor* (QParamsServiceImpl::*method)(
                      grpc::CallbackServerContext*, const Request*, Response*),
                  const Request& request, Response* response) {
  grpc::CallbackServerContext context;
  grpc::testing::DefaultReactorTestPeer peer(&context);
  grpc::ServerUnaryReactor* reactor = (service.*method)(&context, &request, response);
  Check(reactor == peer.reactor(), "a unary handler returned a reactor of its own", &request);
  Check(peer.test_status_set(), "a unary handler returned without finishing", &request);
  const grpc::Status status = peer.test_status();
  switch (status.error_code()) {
    case grpc::StatusCode::OK:
      break;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      Check(!status.error_message().empty(), "an error without a message", &request);
      break;
    default:
      Fail("status code " + std::to_string(status.error_code()) +
               " is not one the contract documents for this server: " + status.error_message(),
           &request);
  }
  // The response goes on the wire.
  std::string wire;
  Check(response->SerializeToString(&wire), "a response that does not serialize", response);
  return status;
}

// ---- Invariants of responses ----

// prod(shape) with every dim >= 0 and no overflow, or -1.
inline int64_t Product(const google::protobuf::RepeatedField<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d != 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

inline void CheckQParams(const v1::QParams& q, const google::protobuf::Message& context) {
  const int64_t n = Product(q.shape());
  Check(n >= 0, "qparams.shape is malformed", &context);
  const bool empty = q.shape_size() == 1 && q.shape(0) == 0;
  Check(n > 0 || empty, "qparams.shape has no blocks but is not the empty [0]", &context);
  Check(q.scale_size() == n, "qparams.scale does not hold prod(shape) values", &context);
  Check(q.zero_point_size() == (q.has_zero_point() ? n : 0), "qparams.zero_point size", &context);
  Check(q.minval_size() == (q.has_minval() ? n : 0), "qparams.minval size", &context);
  Check(q.has_zero_point() == q.has_minval(), "has_zero_point != has_minval", &context);
  Check(empty == (q.precision() == v1::DTYPE_UNSPECIFIED),
        "qparams.precision is set exactly when the buffers are filled", &context);
  for (float s : q.scale()) Check(!(s <= 0), "a scale <= 0", &context);
}

inline bool IsHistogramKind(const std::string& calculator) {
  return calculator == "percentile" || calculator == "entropy" || calculator == "mse";
}

inline void CheckSession(const v1::Session& s) {
  Check(!s.name().empty(), "a session without a name", &s);
  const bool histogram = IsHistogramKind(s.calculator());
  Check(s.calculator() == "static" || s.calculator() == "moving_average" ||
            s.calculator() == "global_minmax" || histogram,
        "a session of a calculator that is not a stateful built-in", &s);
  Check(histogram == s.has_histogram(), "histogram parameters on a kind without them", &s);
  Check(s.has_calibration() == (histogram && s.initialized()),
        "a calibration other than that of an initialized histogram session", &s);
  Check(s.spec().range_calculator() == "minmax", "an unresolved spec.range_calculator", &s);
  Check(s.spec().has_quant_min() && s.spec().has_quant_max(), "an unresolved quant range", &s);
  Check(s.spec().granularity().kind_case() != v1::Granularity::KIND_NOT_SET,
        "an unresolved granularity", &s);
  Check(s.observation_count() >= 0, "a negative observation_count", &s);
  // A histogram session that saw only NaN and infinities (nonfinite=ignore) counted
  // observations but holds no finite value.
  Check(histogram ? !s.initialized() || s.observation_count() > 0
                  : s.initialized() == (s.observation_count() > 0),
        "initialized differs from observation_count > 0", &s);
  CheckQParams(s.qparams(), s);
  Check(s.initialized() == (s.qparams().precision() != v1::DTYPE_UNSPECIFIED),
        "initialized differs from filled buffers", &s);
  Check(s.running_min_size() == s.running_max_size(), "running_min/max sizes differ", &s);
  if (s.calculator() != "static" && !histogram && s.initialized()) {
    Check(s.running_min_size() == s.qparams().scale_size(), "running range size", &s);
  }
  // The histogram kinds take any input dtype at every observation.
  Check((s.initialized() && !histogram) == (s.input_dtype() != v1::DTYPE_UNSPECIFIED),
        "input_dtype is set exactly when initialized (never for histogram kinds)", &s);
}

// The session as GetSession shows it, or nullopt-like empty name when absent.
inline v1::Session Snapshot(Service& s, const std::string& name) {
  v1::GetSessionRequest request;
  request.set_name(name);
  v1::Session session;
  if (!Call(s.service, &QParamsServiceImpl::GetSession, request, &session).ok()) session.Clear();
  return session;
}

inline void CheckUnchanged(const v1::Session& before, const v1::Session& after,
                    const google::protobuf::Message& request) {
  if (!MessageDifferencer::Equals(before, after)) {
    std::fprintf(stderr, "before:\n%s\nafter:\n%s\n", before.DebugString().c_str(),
                 after.DebugString().c_str());
    Fail("a failed call changed its session", &request);
  }
}

// ---- One request ----

template <typename Request>
bool Parse(const uint8_t* data, size_t size, Request* request) {
  return request->ParseFromArray(data, static_cast<int>(size));
}

}  // namespace qparams::fuzz

#endif  // QPARAMS_FUZZ_SERVICE_HARNESS_CORE_H_
