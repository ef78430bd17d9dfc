// The service harness's handlers of the session methods (service_harness.h
// dispatches to them): each parses its request, calls the method and checks the
// answer against the contract.

#ifndef QPARAMS_FUZZ_SERVICE_HARNESS_SESSIONS_H_
#define QPARAMS_FUZZ_SERVICE_HARNESS_SESSIONS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "fuzz/service_harness_core.h"

namespace qparams::fuzz {

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

}  // namespace qparams::fuzz

#endif  // QPARAMS_FUZZ_SERVICE_HARNESS_SESSIONS_H_
