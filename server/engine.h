// The domain behind QParamsService: stateless Compute and the named sessions, with
// the rules of the contract that are not about the wire (which calculators each
// method takes, names, pagination, limits). It knows nothing of gRPC; the service
// translates wire messages to these calls and back.

#ifndef QPARAMS_SERVER_ENGINE_H_
#define QPARAMS_SERVER_ENGINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/granularity.h"
#include "core/observation.h"
#include "core/qparams.h"
#include "core/quant_spec.h"
#include "core/registry.h"
#include "server/session.h"
#include "server/session_store.h"

namespace qparams {

struct EngineOptions {
  int64_t max_sessions = 100000;
};

// One page of ListSessions.
struct SessionPage {
  std::vector<SessionInfo> sessions;
  std::string next_page_token;  // empty on the last page
};

class Engine {
 public:
  static constexpr int kDefaultPageSize = 50;
  static constexpr int kMaxPageSize = 1000;

  explicit Engine(EngineOptions options = {});

  // The registry's classes, sorted by key ("default" among them, stateful).
  std::vector<const CalculatorClass*> ListCalculators() const;

  // The qparams of one observation with a fresh `calculator`: "" or "dynamic", or
  // "static". Other keys are INVALID_ARGUMENT (naming CreateSession for the
  // stateful ones), as are a bad spec and a bad observation. Stores nothing.
  absl::StatusOr<QParams> Compute(absl::string_view calculator, const QuantSpec& spec,
                                  const Observation& x) const;

  // A new session of `calculator` ("" = default, resolved by spec.target). "dynamic"
  // is INVALID_ARGUMENT naming Compute; so are a bad name, spec or averaging
  // constant. ALREADY_EXISTS / RESOURCE_EXHAUSTED from the store.
  absl::StatusOr<SessionInfo> CreateSession(absl::string_view name, absl::string_view calculator,
                                            const QuantSpec& spec,
                                            std::optional<double> averaging_constant);

  // INVALID_ARGUMENT for a malformed name, NOT_FOUND for an unknown one.
  absl::StatusOr<SessionInfo> GetSession(absl::string_view name) const;
  absl::Status DeleteSession(absl::string_view name);

  // Sessions ordered by name whose names start with `filter`. page_size 0 means
  // kDefaultPageSize; it is capped at kMaxPageSize; negative is INVALID_ARGUMENT,
  // as is a page token issued for another filter.
  absl::StatusOr<SessionPage> ListSessions(int page_size, absl::string_view page_token,
                                           absl::string_view filter) const;

  // One forward on the session.
  absl::StatusOr<ObserveResult> Observe(absl::string_view name, const Observation& x);

  // The session's observation count (for responses that report it on failure).
  absl::StatusOr<int64_t> ObservationCount(absl::string_view name) const;

  // get_qparams: the buffers and the initialized flag.
  absl::StatusOr<std::pair<QParams, bool>> GetQParams(absl::string_view name) const;

  absl::StatusOr<SessionInfo> SetExportMode(absl::string_view name, bool enabled);

  // `granularity` unset is INVALID_ARGUMENT; an initialized session is
  // FAILED_PRECONDITION whatever the granularity.
  absl::StatusOr<SessionInfo> SetGranularity(absl::string_view name,
                                             const std::optional<Granularity>& granularity);

  int64_t session_count() const { return store_.size(); }

 private:
  absl::StatusOr<std::shared_ptr<Session>> Find(absl::string_view name) const;

  SessionStore store_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_ENGINE_H_
