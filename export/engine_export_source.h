// The store's sessions under an export's prefix as export items (ExportSource over
// the Engine's SessionCursor): for the NVFP4 formats, the members of the tenant's
// GLOBAL_AMAX scale groups carry the group's result, computed once at Create.

#ifndef QPARAMS_EXPORT_ENGINE_EXPORT_SOURCE_H_
#define QPARAMS_EXPORT_ENGINE_EXPORT_SOURCE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "domain/engine.h"
#include "export/export_format.h"
#include "export/export_group_source.h"
#include "export/export_source.h"

namespace qparams {

// Not thread-safe (an ExportSource). The engine and `groups` must outlive it.
class EngineExportSource final : public ExportSource {
 public:
  // `prefix` must be "" or pass ValidateSessionName. For kCompressedTensors and
  // kModelOpt, with `groups` (null: none), reads every GLOBAL_AMAX group of `tenant`
  // with a member under the prefix and its result. FAILED_PRECONDITION naming the
  // group: uncalibrated members without fill_uncalibrated, a session in two groups
  // whose global scales differ; a group's own error, prefixed with its name; the
  // group source's errors.
  static absl::StatusOr<std::unique_ptr<EngineExportSource>> Create(
      const Engine* engine, std::string tenant, std::string prefix, ExportFormat format,
      const ExportGroupSource* groups);

  // Each pass reads the store again, a page of sessions at a time (SessionCursor).
  std::unique_ptr<ExportPass> NewPass() const override;

 private:
  // A grouped session's group and its result there.
  struct Grouped {
    std::string group;
    ExportGroupSource::Member member;
  };
  class Pass;

  EngineExportSource(const Engine* engine, std::string tenant, std::string prefix)
      : engine_(engine), tenant_(std::move(tenant)), prefix_(std::move(prefix)) {}

  absl::Status LoadGroups(const ExportGroupSource& groups);

  const Engine* const engine_;
  const std::string tenant_;
  const std::string prefix_;
  std::map<std::string, Grouped> grouped_;  // by session name
};

}  // namespace qparams

#endif  // QPARAMS_EXPORT_ENGINE_EXPORT_SOURCE_H_
