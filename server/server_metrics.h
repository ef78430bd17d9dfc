// The metrics of one qparams server (docs/operations.md "Metrics" lists them), in a registry
// of their own: the families are made here, with their names and help, and handed
// to the parts that record them (the journal, the engine, the gRPC layer's calls);
// the gauges read at scrape time (sessions per tenant, storage state, slots) are
// bound to the engine and journal here too. No gRPC, no HTTP.

#ifndef QPARAMS_SERVER_SERVER_METRICS_H_
#define QPARAMS_SERVER_SERVER_METRICS_H_

#include "domain/engine.h"
#include "metrics/metrics.h"
#include "storage/journal.h"

namespace qparams {

// Thread safety: the handles are set by the constructor and never change; recording
// through them is thread-safe (metrics/metrics.h). Watch must be called once, before
// the registry is rendered concurrently.
class ServerMetrics {
 public:
  // Adds every family to `registry`, which must outlive this object.
  explicit ServerMetrics(MetricsRegistry* registry);

  // Calls of the qparams.v1 service by method and gRPC code name ("OK",
  // "NOT_FOUND", ...): how many, and how long each took, arrival to status.
  Family<Counter>* calls() const { return calls_; }
  Family<BucketHistogram>* call_seconds() const { return call_seconds_; }
  // Observations applied (EngineOptions::observations).
  Counter* observations() const { return observations_; }
  // Bytes of observation data received (Observe, ObserveStream, ObserveBatch): a
  // tensor's data, or a range observation's min and max data; applied or refused.
  Counter* received_bytes() const { return received_bytes_; }
  const JournalMetrics& journal() const { return journal_; }
  // Credentials refused, by reason (server/auth.h's Refusal names).
  Family<Counter>* auth_refusals() const { return auth_refusals_; }
  // Step-merged sessions (docs/qat.md): contributions taken, retries excluded; steps
  // closed by their timeout with ranks missing (EngineOptions).
  Counter* step_contributions() const { return step_contributions_; }
  Counter* steps_closed_incomplete() const { return steps_closed_incomplete_; }

  // Binds the scrape-time gauges: sessions per tenant, the replica's slots and the
  // storage state (its session log's) of `engine`, which must outlive the
  // registry's last Render.
  void Watch(const Engine* engine);

 private:
  MetricsRegistry* const registry_;
  Family<Counter>* const calls_;
  Family<BucketHistogram>* const call_seconds_;
  Counter* const observations_;
  Counter* const received_bytes_;
  Family<Counter>* const auth_refusals_;
  Counter* const step_contributions_;
  Counter* const steps_closed_incomplete_;
  JournalMetrics journal_;
};

}  // namespace qparams

#endif  // QPARAMS_SERVER_SERVER_METRICS_H_
