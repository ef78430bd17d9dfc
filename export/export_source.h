// What an Exporter checks and renders: the sessions under the export's prefix as the
// export renders them ("export items"), pass after pass in name order. The store's
// sessions (export/engine_export_source.h) or items a caller supplies, e.g. every
// replica's share of a sharded export (export/item_export_source.h).

#ifndef QPARAMS_EXPORT_EXPORT_SOURCE_H_
#define QPARAMS_EXPORT_EXPORT_SOURCE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "domain/session.h"

namespace qparams {

// One session as exported: for the NVFP4 formats, a member of a GLOBAL_AMAX scale
// group carries the group's result (its qparams, and initialized when the group
// filled it).
struct ExportItem {
  SessionInfo session;
  // The group that filled the session, which never saw data, with the group's global
  // scale; "" when none did. An exported filled weight is refused (no block scales).
  std::string filled_group;
};

// One pass over a source's items. Not thread-safe.
class ExportPass {
 public:
  virtual ~ExportPass() = default;
  // The next item in name order, valid until the next call; null after the last.
  virtual absl::StatusOr<const ExportItem*> Next() = 0;
};

// Not thread-safe: one Exporter reads it. Must outlive its passes.
class ExportSource {
 public:
  virtual ~ExportSource() = default;
  // A new pass from the first item. Each pass may read the store again: an item may
  // differ from the previous pass's, or appear or vanish.
  virtual std::unique_ptr<ExportPass> NewPass() const = 0;
};

}  // namespace qparams

#endif  // QPARAMS_EXPORT_EXPORT_SOURCE_H_
