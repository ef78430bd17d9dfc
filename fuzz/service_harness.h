// The in-process service harness of fuzz_requests and fuzz_restore: a
// QParamsServiceImpl over an Engine, its unary methods called without gRPC's
// transport (each on a test CallbackServerContext whose default reactor records the
// status it finishes with: grpcpp/test/default_reactor_test_peer.h), and the contract
// rules of shared/docs/api.md checked on every answer. This header holds the methods'
// numbering and the dispatch; the service and the checks are in
// service_harness_core.h, the handlers in service_harness_sessions.h and
// service_harness_groups.h.

#ifndef QPARAMS_FUZZ_SERVICE_HARNESS_H_
#define QPARAMS_FUZZ_SERVICE_HARNESS_H_

#include <cstddef>
#include <cstdint>

#include "fuzz/service_harness_core.h"
#include "fuzz/service_harness_groups.h"
#include "fuzz/service_harness_sessions.h"

namespace qparams::fuzz {

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
