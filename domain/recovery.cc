#include "domain/recovery.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "core/status_macros.h"

namespace qparams {

absl::Status EngineRecords::Emit(const Engine& engine, const Journal::Emitter& emit) {
  QPARAMS_RETURN_IF_ERROR(engine.store_.EmitRecords(emit));
  return engine.groups_.EmitRecords(emit);
}

std::vector<storage::v1::Record> EngineRecords::Of(const Engine& engine) {
  std::vector<storage::v1::Record> records;
  Emit(engine, [&](const storage::v1::Record& record) {
    records.push_back(record);
    return absl::OkStatus();
  }).IgnoreError();  // the emitter never fails
  return records;
}

std::optional<std::string> EngineRecords::Replay(Engine& engine,
                                                 const storage::v1::Record& record) {
  switch (record.kind_case()) {
    case storage::v1::Record::kGroupCreate:
    case storage::v1::Record::kGroupDelete:
      return engine.groups_.Replay(record);
    default:
      return engine.store_.Replay(record);
  }
}

std::vector<std::string> EngineRecords::Restore(Engine& engine,
                                                const std::vector<storage::v1::Record>& records) {
  std::vector<std::string> problems;
  for (const storage::v1::Record& record : records) {
    if (std::optional<std::string> problem = Replay(engine, record)) {
      problems.push_back(*std::move(problem));
    }
  }
  return problems;
}

absl::Status EngineRecords::Recover(Engine& engine, Journal& journal) {
  const absl::Time start = absl::Now();
  bool skipped = false;
  QPARAMS_ASSIGN_OR_RETURN(const Recovery recovery,
                           journal.Recover([&engine, &skipped](const storage::v1::Record& record) {
                             if (std::optional<std::string> problem = Replay(engine, record)) {
                               LogError(*problem);
                               skipped = true;
                             }
                           }));
  for (const std::string& problem : recovery.problems) LogError(problem);
  // Records that were skipped are dropped for good by a snapshot, not met again at
  // every start.
  QPARAMS_RETURN_IF_ERROR(
      journal.Start([&engine](const Journal::Emitter& emit) { return Emit(engine, emit); },
                    /*snapshot=*/skipped));
  const JournalOptions& options = engine.options_.journal;
  LogInfo(
      absl::StrCat("restored ", engine.session_count(), " session(s) and ",
                   engine.scale_group_count(), " scale group(s) from ", options.data_dir, " (",
                   recovery.files_read, " file(s), ", recovery.records, " record(s)) in ",
                   absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
                   "; durability ", DurabilityName(options.durability)));
  return absl::OkStatus();
}

}  // namespace qparams
