// What the domain persists, and the one interface it persists through: the records
// of a session store (a session's whole state, its erasure, its eviction) and of the
// scale groups (a group's creation, its deletion), appended in order and made as
// durable as promised. The domain holds a SessionLog& and never sees a record: the
// log implementation encodes them (storage/session_codec.h, storage/group_codec.h).
//
// Journal (storage/journal.h) keeps them in a data directory; NullSessionLog, for a
// server without one, keeps nothing.

#ifndef QPARAMS_STORAGE_SESSION_LOG_H_
#define QPARAMS_STORAGE_SESSION_LOG_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/dedupe_window.h"
#include "core/calculator_state.h"
#include "storage/group_codec.h"
#include "storage/session_codec.h"

namespace qparams {

// Thread safety: every method but Close may be called concurrently. Records of one
// session must be appended in their order (the domain appends under the session's
// lock), as must those of one scale group (under the group store's lock).
class SessionLog {
 public:
  virtual ~SessionLog() = default;

  // False for a log that keeps nothing: its appends cannot fail, so a mutation may
  // apply in place, with no copy to fall back on.
  virtual bool keeps_records() const = 0;

  // Appends a session's whole state (its calculator's and its dedupe window's), its
  // erasure, or its eviction at `evict_time` (written before returning) and returns the record's sequence number for Sync.
  // UNAVAILABLE once the log is broken (a write or fsync failed): every later append
  // fails too.
  // `steps`: a step-merged session's (core/step_merge.h), unset for the others.
  virtual absl::StatusOr<uint64_t> AppendPut(
      const SessionKey& key, const CalculatorState& state, absl::Time create_time,
      absl::Time update_time, const DedupeWindow& dedupe,
      const std::optional<StepState>& steps) = 0;
  // Appends a step contribution that applied no step (EncodeContribution), which
  // replays onto the session's last put; as AppendPut otherwise.
  virtual absl::StatusOr<uint64_t> AppendContribution(const SessionKey& key,
                                                      const StepContribution& contribution,
                                                      absl::Time update_time) = 0;
  virtual absl::StatusOr<uint64_t> AppendErase(const SessionKey& key) = 0;
  virtual absl::StatusOr<uint64_t> AppendEviction(const SessionKey& key,
                                                  absl::Time evict_time) = 0;

  // Appends a scale group's creation under `tenant` (names, share, fill_uncalibrated
  // and create_time) or its deletion, as the session appends above: the sequence
  // number for Sync, UNAVAILABLE once the log is broken.
  virtual absl::StatusOr<uint64_t> AppendGroupCreate(absl::string_view tenant,
                                                     const ScaleGroupInfo& group) = 0;
  virtual absl::StatusOr<uint64_t> AppendGroupDelete(absl::string_view tenant,
                                                     absl::string_view name) = 0;

  // Returns once every record up to `sequence` is as durable as the log promises
  // (Durability), or the failure that broke the log.
  virtual absl::Status Sync(uint64_t sequence) = 0;

  // OK while the log takes appends, else the failure that broke it.
  virtual absl::Status health() const = 0;

  // Makes everything appended durable and stops the log's own work. Idempotent; not
  // concurrent with appends (the server calls it once no call is in flight).
  virtual absl::Status Close() = 0;
};

// Memory only: every append succeeds and keeps nothing.
class NullSessionLog final : public SessionLog {
 public:
  bool keeps_records() const override { return false; }
  absl::StatusOr<uint64_t> AppendPut(const SessionKey&, const CalculatorState&, absl::Time,
                                     absl::Time, const DedupeWindow&,
                                     const std::optional<StepState>&) override {
    return 0;
  }
  absl::StatusOr<uint64_t> AppendContribution(const SessionKey&, const StepContribution&,
                                              absl::Time) override {
    return 0;
  }
  absl::StatusOr<uint64_t> AppendErase(const SessionKey&) override { return 0; }
  absl::StatusOr<uint64_t> AppendEviction(const SessionKey&, absl::Time) override { return 0; }
  absl::StatusOr<uint64_t> AppendGroupCreate(absl::string_view, const ScaleGroupInfo&) override {
    return 0;
  }
  absl::StatusOr<uint64_t> AppendGroupDelete(absl::string_view, absl::string_view) override {
    return 0;
  }
  absl::Status Sync(uint64_t) override { return absl::OkStatus(); }
  absl::Status health() const override { return absl::OkStatus(); }
  absl::Status Close() override { return absl::OkStatus(); }
};

}  // namespace qparams

#endif  // QPARAMS_STORAGE_SESSION_LOG_H_
