// Sessions in the on-disk format (qparams.storage.v1): a core CalculatorState plus
// the session's key and times. Decoding checks the state through CreateFromState, so
// a record that parses but is inconsistent is refused, never half-restored.
//
// The storage format's messages (storage/qparams/storage/v1/storage.proto) hold the
// core values the wire shares (qparams/v1/types.proto), which convert by their one
// codec (types/codec.h); this codec translates the rest, the format's own, and knows
// nothing of the wire contract.

#ifndef QPARAMS_STORAGE_SESSION_CODEC_H_
#define QPARAMS_STORAGE_SESSION_CODEC_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/dedupe_window.h"
#include "core/calculator_state.h"
#include "core/qparams_calculator.h"
#include "core/step_merge.h"
#include "google/protobuf/timestamp.pb.h"
#include "qparams/storage/v1/storage.pb.h"

namespace qparams {

// Who owns a session and what it is called; tenant "" when authentication is off.
struct SessionKey {
  std::string tenant;
  std::string name;
  friend bool operator==(const SessionKey& a, const SessionKey& b) {
    return a.tenant == b.tenant && a.name == b.name;
  }
};

storage::v1::SessionKey EncodeKey(const SessionKey& key);
SessionKey DecodeKey(const storage::v1::SessionKey& key);

// The record of an eviction.
storage::v1::Record EncodeEviction(const SessionKey& key, absl::Time evict_time);

// A session's whole state as a record: its calculator's, its dedupe window's and, for
// a step-merged session, its steps'.
storage::v1::SessionState EncodeSession(const SessionKey& key, const CalculatorState& state,
                                        absl::Time create_time, absl::Time update_time,
                                        const DedupeWindow& dedupe = {},
                                        const std::optional<StepState>& steps = std::nullopt);

// A decoded record: the calculator rebuilt from it, ready to continue bit-identically.
struct DecodedSession {
  SessionKey key;
  std::unique_ptr<StatefulQParamsCalculatorBase> calculator;
  absl::Time create_time;
  absl::Time update_time;
  DedupeWindow dedupe;             // empty for a record written before idempotency keys
  std::optional<StepMerge> steps;  // a step-merged session's
};

// INVALID_ARGUMENT (naming the session) for a record that does not describe a
// consistent stateful calculator and dedupe window.
absl::StatusOr<DecodedSession> DecodeSession(const storage::v1::SessionState& record);

// A step contribution that applied no step, as a record of its own: far smaller than
// the session's whole state, and replayed onto the state its session's last put
// left (Session::ReplayContribution).
storage::v1::Record EncodeContribution(const SessionKey& key, const StepContribution& c,
                                       absl::Time update_time);
struct DecodedContribution {
  SessionKey key;
  StepContribution contribution;
  absl::Time update_time;
};
// INVALID_ARGUMENT for a range of an unknown dtype; the rest is the merge's to check.
absl::StatusOr<DecodedContribution> DecodeContribution(const storage::v1::StepContributed& record);

}  // namespace qparams

#endif  // QPARAMS_STORAGE_SESSION_CODEC_H_
