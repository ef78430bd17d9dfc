// The in-process service harness of fuzz_requests and fuzz_restore: a
// QParamsServiceImpl over an Engine, its unary methods called without gRPC's
// transport (each on a test CallbackServerContext whose default reactor records the
// status it finishes with: grpcpp/test/default_reactor_test_peer.h), and the contract
// rules of shared/docs/api.md checked on every answer.

#ifndef QPARAMS_FUZZ_SERVICE_HARNESS_H_
#define QPARAMS_FUZZ_SERVICE_HARNESS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
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

enum Method : uint8_t {
  kCompute = 0,
  kCreateSession,
  kObserve,
  kListSessions,
  kSetGranularity,
  kSetExportMode,
  kGetSession,
  kDeleteSession,
  kGetQParams,
  kListCalculators,
  kObserveBatch,
  kGetHistogram,
  kCreateScaleGroup,
  kGetScaleGroup,
  kListScaleGroups,
  kDeleteScaleGroup,
  kGetGroupQParams,
  kMethods,
};

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

// One function per method: parses its request (false if the bytes are not that
// message), calls it and checks the answer.
inline bool HandleCompute(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::ComputeRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ComputeResponse response;
  if (Call(svc, &QParamsServiceImpl::Compute, request, &response).ok()) {
    CheckQParams(response.qparams(), response);
    Check(response.qparams().shape_size() == request.tensor().shape_size(),
          "Compute's qparams rank differs from the tensor's", &request);
  }
  return true;
}

inline bool HandleCreateSession(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::CreateSessionRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::Session before = Snapshot(s, request.name());
  v1::Session response;
  const grpc::Status status = Call(svc, &QParamsServiceImpl::CreateSession, request, &response);
  if (!status.ok()) {
    CheckUnchanged(before, Snapshot(s, request.name()), request);
    return true;
  }
  CheckSession(response);
  Check(response.name() == request.name(), "CreateSession named the session otherwise",
        &response);
  Check(response.observation_count() == 0 && !response.initialized(),
        "a new session is not empty", &response);
  // "Sending a session's spec back to CreateSession gives an identical session."
  v1::CreateSessionRequest again;
  again.set_name("zz.fuzz.respec");
  again.set_calculator(response.calculator());
  *again.mutable_spec() = response.spec();
  if (response.calculator() == "moving_average") {
    again.set_averaging_constant(response.averaging_constant());
  }
  if (response.has_histogram()) *again.mutable_histogram() = response.histogram();
  v1::Session copy;
  const grpc::Status copied = Call(svc, &QParamsServiceImpl::CreateSession, again, &copy);
  if (copied.ok()) {
    Check(MessageDifferencer::Equals(copy.spec(), response.spec()) &&
              copy.calculator() == response.calculator() &&
              copy.averaging_constant() == response.averaging_constant() &&
              MessageDifferencer::Equals(copy.histogram(), response.histogram()) &&
              copy.description() == response.description(),
          "the resolved spec sent back gives another session", &copy);
    v1::DeleteSessionRequest del;
    del.set_name(again.name());
    v1::DeleteSessionResponse deleted;
    Check(Call(svc, &QParamsServiceImpl::DeleteSession, del, &deleted).ok(),
          "cannot delete a session just created", &del);
  } else {
    Check(copied.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
              copied.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED,
          "the resolved spec sent back is refused: " + copied.error_message(), &again);
  }
  return true;
}

inline bool HandleObserve(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::ObserveRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::Session before = Snapshot(s, request.name());
  v1::ObserveResponse response;
  const grpc::Status status = Call(svc, &QParamsServiceImpl::Observe, request, &response);
  const v1::Session after = Snapshot(s, request.name());
  if (!status.ok()) {
    CheckUnchanged(before, after, request);
    Check(response.observation_count() == before.observation_count(),
          "a failed Observe reports another observation_count", &response);
    return true;
  }
  CheckSession(after);
  if (response.duplicate()) {
    // A key applied before (docs/retries.md): answered with the original count, and
    // nothing applied.
    CheckUnchanged(before, after, request);
    Check(response.observation_count() <= after.observation_count(),
          "a duplicate Observe reports a count above the session's", &response);
    return true;
  }
  Check(response.observation_count() == after.observation_count(),
        "Observe's observation_count differs from the session's", &response);
  if (request.omit_qparams()) {
    Check(!response.has_qparams() && !response.has_calibration(),
          "Observe sent the qparams it was asked to omit", &response);
  } else {
    CheckQParams(response.qparams(), response);
    Check(MessageDifferencer::Equals(response.qparams(), after.qparams()) &&
              MessageDifferencer::Equals(response.calibration(), after.calibration()),
          "Observe's qparams differ from the session's buffers", &response);
  }
  const bool cached = before.export_mode() ||
                      (before.initialized() && before.spec().float_range().has_min() &&
                       before.spec().float_range().has_max());
  Check(after.observation_count() == before.observation_count() + (cached ? 0 : 1),
        "Observe did not count exactly the computing forward", &response);
  return true;
}

inline bool HandleObserveBatch(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::ObserveBatchRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ObserveBatchResponse response;
  const grpc::Status status = Call(svc, &QParamsServiceImpl::ObserveBatch, request, &response);
  if (!status.ok()) {
    Check(status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
              request.observations_size() > wire::kMaxBatchObservations,
          "ObserveBatch failed as a whole: " + status.error_message(), &request);
    return true;
  }
  Check(response.responses_size() == request.observations_size(),
        "ObserveBatch answered another number of observations", &response);
  // Each item is answered as Observe answers it; the last answer for a session
  // carries the session's count.
  std::map<std::string, int64_t> last_count;
  for (int i = 0; i < response.responses_size(); ++i) {
    const v1::ObserveRequest& item = request.observations(i);
    const v1::ObserveResponse& answer = response.responses(i);
    if (answer.status().code() != 0) {
      Check(!answer.status().message().empty(), "a failed item without a message", &answer);
      Check(!answer.has_qparams(), "a failed item with qparams", &answer);
    } else if (item.omit_qparams()) {
      Check(!answer.has_qparams(), "an item sent the qparams it was asked to omit", &answer);
    } else {
      CheckQParams(answer.qparams(), answer);
    }
    // A duplicate carries the original's count, and changes nothing.
    if (!answer.duplicate()) last_count[item.name()] = answer.observation_count();
  }
  for (const auto& [name, count] : last_count) {
    Check(Snapshot(s, name).observation_count() == count,
          "ObserveBatch's last count for a session differs from the session's", &response);
  }
  return true;
}

inline bool HandleListSessions(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::ListSessionsRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ListSessionsResponse response;
  if (!Call(svc, &QParamsServiceImpl::ListSessions, request, &response).ok()) return true;
  const int limit = request.page_size() == 0 ? Engine::kDefaultPageSize
                                             : std::min(request.page_size(),
                                                        Engine::kMaxPageSize);
  Check(response.sessions_size() <= limit, "a page larger than page_size", &response);
  for (int i = 0; i < response.sessions_size(); ++i) {
    CheckSession(response.sessions(i));
    Check(response.sessions(i).name().compare(0, request.filter().size(), request.filter()) ==
              0,
          "a listed session does not match the filter", &response);
    if (i > 0) {
      Check(response.sessions(i - 1).name() < response.sessions(i).name(),
            "sessions are not in byte order", &response);
    }
  }
  if (!response.next_page_token().empty()) {
    Check(response.sessions_size() == limit, "a page before the last is not full", &response);
    v1::ListSessionsRequest next = request;
    next.set_page_token(response.next_page_token());
    v1::ListSessionsResponse next_response;
    Check(Call(svc, &QParamsServiceImpl::ListSessions, next, &next_response).ok(),
          "the next_page_token is refused", &next);
    if (next_response.sessions_size() > 0 && response.sessions_size() > 0) {
      Check(response.sessions(response.sessions_size() - 1).name() <
                next_response.sessions(0).name(),
            "the next page does not continue the previous one", &next_response);
    }
  }
  return true;
}

inline bool HandleSetGranularity(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::SetGranularityRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::Session before = Snapshot(s, request.name());
  v1::Session response;
  const grpc::Status status =
      Call(svc, &QParamsServiceImpl::SetGranularity, request, &response);
  if (!status.ok()) {
    CheckUnchanged(before, Snapshot(s, request.name()), request);
    return true;
  }
  CheckSession(response);
  Check(!before.initialized(), "SetGranularity succeeded on an initialized session",
        &response);
  return true;
}

inline bool HandleSetExportMode(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::SetExportModeRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::Session before = Snapshot(s, request.name());
  v1::Session response;
  const grpc::Status status = Call(svc, &QParamsServiceImpl::SetExportMode, request, &response);
  if (!status.ok()) {
    CheckUnchanged(before, Snapshot(s, request.name()), request);
    return true;
  }
  CheckSession(response);
  Check(response.export_mode() == request.enabled(), "export_mode not as set", &response);
  Check(MessageDifferencer::Equals(response.qparams(), before.qparams()),
        "SetExportMode changed the buffers", &response);
  return true;
}

inline bool HandleGetSession(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::GetSessionRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::Session response;
  if (Call(svc, &QParamsServiceImpl::GetSession, request, &response).ok()) {
    CheckSession(response);
    Check(response.name() == request.name(), "GetSession answered another session",
          &response);
  }
  return true;
}

inline bool HandleDeleteSession(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::DeleteSessionRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::DeleteSessionResponse response;
  if (Call(svc, &QParamsServiceImpl::DeleteSession, request, &response).ok()) {
    v1::GetSessionRequest get;
    get.set_name(request.name());
    v1::Session session;
    Check(Call(svc, &QParamsServiceImpl::GetSession, get, &session).error_code() ==
              grpc::StatusCode::NOT_FOUND,
          "a deleted session is still there", &request);
  }
  return true;
}

inline bool HandleGetQParams(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::GetQParamsRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::GetQParamsResponse response;
  if (Call(svc, &QParamsServiceImpl::GetQParams, request, &response).ok()) {
    CheckQParams(response.qparams(), response);
    const v1::Session session = Snapshot(s, request.name());
    Check(MessageDifferencer::Equals(response.qparams(), session.qparams()) &&
              MessageDifferencer::Equals(response.calibration(), session.calibration()) &&
              response.initialized() == session.initialized(),
          "GetQParams differs from GetSession", &response);
  }
  return true;
}

inline bool HandleGetHistogram(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::GetHistogramRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::HistogramObservation response;
  if (Call(svc, &QParamsServiceImpl::GetHistogram, request, &response).ok()) {
    const v1::Session session = Snapshot(s, request.name());
    Check(IsHistogramKind(session.calculator()), "GetHistogram of a kind without one",
          &response);
    Check(response.num_bins() == session.histogram().num_bins(),
          "GetHistogram's num_bins differs from the session's", &response);
    Check(
        response.has_min() == session.initialized() && response.has_max() == response.has_min(),
        "GetHistogram's extrema are set exactly when the session is initialized", &response);
    if (session.initialized()) {
      Check(response.exponent() == session.calibration().exponent(),
            "GetHistogram's exponent differs from the calibration's", &response);
    }
  }
  return true;
}

inline bool HandleListCalculators(Service& s, const uint8_t* data, size_t size) {
  QParamsServiceImpl& svc = s.service;
  v1::ListCalculatorsRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ListCalculatorsResponse response;
  Check(Call(svc, &QParamsServiceImpl::ListCalculators, request, &response).ok(),
        "ListCalculators failed", &request);
  return true;
}
// ---- Scale groups ----

// The group as GetScaleGroup shows it, or an empty message when absent.
inline v1::ScaleGroup GroupSnapshot(Service& s, const std::string& name) {
  v1::GetScaleGroupRequest request;
  request.set_name(name);
  v1::ScaleGroup group;
  if (!Call(s.service, &QParamsServiceImpl::GetScaleGroup, request, &group).ok()) group.Clear();
  return group;
}

inline void CheckGroup(const v1::ScaleGroup& g) {
  Check(!g.name().empty(), "a group without a name", &g);
  Check(g.members_size() >= 1 && g.members_size() <= kMaxGroupMembers,
        "a group with no members or more than kMaxGroupMembers", &g);
  Check(g.share() == v1::ScaleGroup::GLOBAL_AMAX || g.share() == v1::ScaleGroup::UNION_RANGE,
        "a group of an unknown share", &g);
  Check(g.has_create_time(), "a group without a create_time", &g);
}

// The sessions a group request names (the first few: a failed call must change
// none of them).
inline std::vector<v1::Session> MemberSnapshots(Service& s,
                                                const google::protobuf::RepeatedPtrField<std::string>& members) {
  std::vector<v1::Session> out;
  for (int i = 0; i < members.size() && i < 8; ++i) out.push_back(Snapshot(s, members[i]));
  return out;
}

inline void CheckMembersUnchanged(Service& s, const google::protobuf::RepeatedPtrField<std::string>& members,
                                  const std::vector<v1::Session>& before,
                                  const google::protobuf::Message& request) {
  for (size_t i = 0; i < before.size(); ++i) {
    CheckUnchanged(before[i], Snapshot(s, members[static_cast<int>(i)]), request);
  }
}

inline bool HandleCreateScaleGroup(Service& s, const uint8_t* data, size_t size) {
  v1::CreateScaleGroupRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::ScaleGroup& asked = request.group();
  const v1::ScaleGroup before = GroupSnapshot(s, asked.name());
  const std::vector<v1::Session> members = MemberSnapshots(s, asked.members());
  v1::ScaleGroup response;
  const grpc::Status status =
      Call(s.service, &QParamsServiceImpl::CreateScaleGroup, request, &response);
  // Creating a group changes none of its members, whether or not it succeeds.
  CheckMembersUnchanged(s, asked.members(), members, request);
  if (!status.ok()) {
    Check(MessageDifferencer::Equals(before, GroupSnapshot(s, asked.name())),
          "a failed CreateScaleGroup changed the group of that name", &request);
    return true;
  }
  CheckGroup(response);
  Check(before.name().empty(), "CreateScaleGroup replaced an existing group", &request);
  Check(response.name() == asked.name() && response.share() == asked.share() &&
            response.fill_uncalibrated() == asked.fill_uncalibrated() &&
            std::equal(response.members().begin(), response.members().end(),
                       asked.members().begin(), asked.members().end()),
        "CreateScaleGroup answered another group than it was asked for", &response);
  Check(MessageDifferencer::Equals(response, GroupSnapshot(s, asked.name())),
        "GetScaleGroup differs from what CreateScaleGroup answered", &response);
  return true;
}

inline bool HandleGetScaleGroup(Service& s, const uint8_t* data, size_t size) {
  v1::GetScaleGroupRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ScaleGroup response;
  if (Call(s.service, &QParamsServiceImpl::GetScaleGroup, request, &response).ok()) {
    CheckGroup(response);
    Check(response.name() == request.name(), "GetScaleGroup answered another group", &response);
  }
  return true;
}

inline bool HandleListScaleGroups(Service& s, const uint8_t* data, size_t size) {
  v1::ListScaleGroupsRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ListScaleGroupsResponse response;
  if (!Call(s.service, &QParamsServiceImpl::ListScaleGroups, request, &response).ok()) {
    return true;
  }
  const int limit = request.page_size() == 0
                        ? Engine::kDefaultPageSize
                        : std::min(request.page_size(), Engine::kMaxPageSize);
  Check(response.groups_size() <= limit, "a page of groups larger than page_size", &response);
  for (int i = 0; i < response.groups_size(); ++i) {
    CheckGroup(response.groups(i));
    Check(response.groups(i).name().compare(0, request.filter().size(), request.filter()) == 0,
          "a listed group does not match the filter", &response);
    if (i > 0) {
      Check(response.groups(i - 1).name() < response.groups(i).name(),
            "groups are not in byte order", &response);
    }
  }
  if (!response.next_page_token().empty()) {
    Check(response.groups_size() == limit, "a page of groups before the last is not full",
          &response);
    v1::ListScaleGroupsRequest next = request;
    next.set_page_token(response.next_page_token());
    v1::ListScaleGroupsResponse next_response;
    Check(Call(s.service, &QParamsServiceImpl::ListScaleGroups, next, &next_response).ok(),
          "the groups' next_page_token is refused", &next);
    if (next_response.groups_size() > 0 && response.groups_size() > 0) {
      Check(response.groups(response.groups_size() - 1).name() < next_response.groups(0).name(),
            "the next page of groups does not continue the previous one", &next_response);
    }
  }
  return true;
}

inline bool HandleDeleteScaleGroup(Service& s, const uint8_t* data, size_t size) {
  v1::DeleteScaleGroupRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::ScaleGroup before = GroupSnapshot(s, request.name());
  const std::vector<v1::Session> members = MemberSnapshots(s, before.members());
  v1::DeleteScaleGroupResponse response;
  const grpc::Status status =
      Call(s.service, &QParamsServiceImpl::DeleteScaleGroup, request, &response);
  // Deleting a group never deletes (or changes) its members.
  CheckMembersUnchanged(s, before.members(), members, request);
  if (status.ok()) {
    Check(GroupSnapshot(s, request.name()).name().empty(), "a deleted group is still there",
          &request);
  } else {
    Check(MessageDifferencer::Equals(before, GroupSnapshot(s, request.name())),
          "a failed DeleteScaleGroup changed the group", &request);
  }
  return true;
}

inline bool HandleGetGroupQParams(Service& s, const uint8_t* data, size_t size) {
  v1::GetGroupQParamsRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::ScaleGroup group = GroupSnapshot(s, request.name());
  const std::vector<v1::Session> members = MemberSnapshots(s, group.members());
  v1::GroupQParams response;
  const grpc::Status status =
      Call(s.service, &QParamsServiceImpl::GetGroupQParams, request, &response);
  CheckMembersUnchanged(s, group.members(), members, request);
  if (!status.ok()) return true;
  Check(!group.name().empty(), "GetGroupQParams answered for a group that does not exist",
        &request);
  Check(response.group() == request.name(), "GetGroupQParams answered another group", &response);
  Check(response.uncalibrated_size() <= group.members_size(),
        "more uncalibrated members than members", &response);
  if (!response.initialized()) {
    Check(response.uncalibrated_size() > 0,
          "an uninitialized group result that names no uncalibrated member", &response);
    return true;
  }
  if (group.share() == v1::ScaleGroup::GLOBAL_AMAX) {
    Check(response.members_size() == group.members_size(),
          "a GLOBAL_AMAX result without one entry per member", &response);
    for (int i = 0; i < response.members_size(); ++i) {
      Check(response.members(i).name() == group.members(i),
            "a GLOBAL_AMAX result's members are not in member order", &response);
      if (response.members(i).has_amax()) CheckQParams(response.members(i).qparams(), response);
    }
  } else {
    CheckQParams(response.qparams(), response);
    Check(response.qparams().shape_size() == 1 && response.qparams().shape(0) == 1,
          "a UNION_RANGE result whose qparams are not of shape [1]", &response);
    Check(!(response.min() > response.max()), "a union range with min > max", &response);
  }
  return true;
}

// Runs one request on `s`; returns false if the bytes are not that message.
inline bool Handle(Service& s, uint8_t method, const uint8_t* data, size_t size) {
  switch (method % kMethods) {
    case kCompute:
      return HandleCompute(s, data, size);
    case kCreateSession:
      return HandleCreateSession(s, data, size);
    case kObserve:
      return HandleObserve(s, data, size);
    case kObserveBatch:
      return HandleObserveBatch(s, data, size);
    case kListSessions:
      return HandleListSessions(s, data, size);
    case kSetGranularity:
      return HandleSetGranularity(s, data, size);
    case kSetExportMode:
      return HandleSetExportMode(s, data, size);
    case kGetSession:
      return HandleGetSession(s, data, size);
    case kDeleteSession:
      return HandleDeleteSession(s, data, size);
    case kGetQParams:
      return HandleGetQParams(s, data, size);
    case kGetHistogram:
      return HandleGetHistogram(s, data, size);
    case kListCalculators:
      return HandleListCalculators(s, data, size);
    case kCreateScaleGroup:
      return HandleCreateScaleGroup(s, data, size);
    case kGetScaleGroup:
      return HandleGetScaleGroup(s, data, size);
    case kListScaleGroups:
      return HandleListScaleGroups(s, data, size);
    case kDeleteScaleGroup:
      return HandleDeleteScaleGroup(s, data, size);
    case kGetGroupQParams:
      return HandleGetGroupQParams(s, data, size);
  }
  return false;
}

}  // namespace qparams::fuzz

#endif  // QPARAMS_FUZZ_SERVICE_HARNESS_H_
