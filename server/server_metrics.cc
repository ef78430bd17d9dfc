#include "server/server_metrics.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/slot.h"
#include "common/slot_map.h"
#include "storage/session_log.h"

namespace qparams {

ServerMetrics::ServerMetrics(MetricsRegistry* registry)
    : registry_(registry),
      calls_(registry->AddCounter(
          "qparams_calls_total",
          "Calls of the qparams.v1 service, by method and gRPC status code, counted when "
          "they finish (a stream once, at its end).",
          {"method", "code"})),
      call_seconds_(registry->AddHistogram(
          "qparams_call_duration_seconds",
          "Time from a call's arrival to its status, by method and gRPC status code (a "
          "stream's whole life).",
          {"method", "code"}, LatencyBuckets())),
      observations_(registry
                        ->AddCounter("qparams_observations_total",
                                     "Observations applied to sessions (Observe, ObserveStream, "
                                     "ObserveBatch); refused ones are not counted.")
                        ->WithLabels({})),
      received_bytes_(registry
                          ->AddCounter("qparams_received_bytes_total",
                                       "Bytes of observation data received: each observation's "
                                       "tensor data, or its range's min and max data, whether "
                                       "applied or refused (names, shapes and framing excluded).")
                          ->WithLabels({})),
      auth_refusals_(registry->AddCounter(
          "qparams_auth_refusals_total",
          "Calls refused for their credential, by reason: missing, malformed, unknown, "
          "expired, not_admin (a tenant's token on an admin call), not_tenant (an admin's "
          "token on a data call), admin_off (an admin call; no --admin_tokens_file).",
          {"reason"})),
      step_contributions_(registry
                              ->AddCounter("qparams_step_contributions_total",
                                           "Step contributions taken by step-merged sessions "
                                           "(docs/qat.md); retries and refusals excluded.")
                              ->WithLabels({})),
      steps_closed_incomplete_(
          registry
              ->AddCounter("qparams_steps_closed_incomplete_total",
                           "Steps of step-merged sessions closed by their timeout with ranks "
                           "missing (each session's steps counted apart).")
              ->WithLabels({})) {
  journal_.appends = registry
                         ->AddCounter("qparams_journal_appends_total",
                                      "Records appended to the journal (--data_dir).")
                         ->WithLabels({});
  journal_.appended_bytes = registry
                                ->AddCounter("qparams_journal_appended_bytes_total",
                                             "Bytes appended to the journal, framing included.")
                                ->WithLabels({});
  journal_.fsync_seconds =
      registry
          ->AddHistogram("qparams_journal_fsync_duration_seconds",
                         "Time of each fsync of a journal file.", {}, LatencyBuckets())
          ->WithLabels({});
  journal_.snapshot_seconds =
      registry
          ->AddHistogram("qparams_snapshot_duration_seconds",
                         "Time to write each snapshot of the sessions (collect, write, fsync, "
                         "rename), successful ones only.",
                         {}, {0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300})
          ->WithLabels({});
  journal_.snapshot_failures = registry
                                   ->AddCounter("qparams_snapshot_failures_total",
                                                "Snapshots that could not be written (the older "
                                                "snapshot and journals stay).")
                                   ->WithLabels({});
}

void ServerMetrics::Watch(const Engine* engine) {
  registry_->AddGaugeCallback(
      "qparams_sessions", "Sessions held, by tenant (\"\" when authentication is off).", {"tenant"},
      [engine] {
        std::vector<GaugeSample> samples;
        for (auto& [tenant, count] : engine->SessionsPerTenant()) {
          samples.push_back({{std::move(tenant)}, static_cast<double>(count)});
        }
        return samples;
      });
  registry_->AddGaugeCallback(
      "qparams_storage_state",
      "1 for the state the storage is in, 0 for the others: ok (the journal takes "
      "mutations), read_only (a write or fsync failed: mutations are refused until "
      "restart), memory_only (no --data_dir, or --durability=none).",
      {"state"}, [engine] {
        const SessionLog& log = engine->log();
        const char* state = !log.keeps_records() ? "memory_only"
                            : log.health().ok()  ? "ok"
                                                 : "read_only";
        std::vector<GaugeSample> samples;
        for (const char* s : {"ok", "read_only", "memory_only"}) {
          samples.push_back({{s}, std::string(s) == state ? 1.0 : 0.0});
        }
        return samples;
      });
  // Read at every scrape: SetSlotMap and SIGHUP change the map while serving.
  registry_->AddGaugeCallback(
      "qparams_owned_slots",
      "Slots of the slot map this replica owns (all of them without --slot_map).", {},
      [engine] {
        const std::shared_ptr<const SlotMap> map = engine->slot_map();
        const int owned = map == nullptr ? kSlotCount : map->SlotsOf(engine->replica_id());
        return std::vector<GaugeSample>{{{}, static_cast<double>(owned)}};
      });
  registry_->AddGaugeCallback(
      "qparams_slot_map_epoch",
      "The epoch of the slot map this replica serves (0 without --slot_map).", {}, [engine] {
        const std::shared_ptr<const SlotMap> map = engine->slot_map();
        return std::vector<GaugeSample>{
            {{}, map == nullptr ? 0.0 : static_cast<double>(map->epoch())}};
      });
  registry_->AddGaugeCallback(
      "qparams_replica_info",
      "Always 1; its label is this replica's --replica_id (\"\" without sharding).", {"replica"},
      [replica = engine->replica_id()] {
        return std::vector<GaugeSample>{{{replica}, 1.0}};
      });
}

}  // namespace qparams
