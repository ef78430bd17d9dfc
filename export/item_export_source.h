// Export items a caller supplies (RenderExport: every replica's share of a sharded
// export), held in memory and passed over in name order. The items come from the
// wire, so each is checked for what rendering relies on before it is kept.

#ifndef QPARAMS_EXPORT_ITEM_EXPORT_SOURCE_H_
#define QPARAMS_EXPORT_ITEM_EXPORT_SOURCE_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "export/export_source.h"

namespace qparams {

// Not thread-safe (an ExportSource): Add every item, Seal once, then pass over them.
class ItemExportSource final : public ExportSource {
 public:
  // What a render holds at most: items, and their bytes as HeldBytes counts them.
  static constexpr size_t kMaxItems = 1000000;
  static constexpr size_t kMaxBytes = size_t{1} << 30;

  // `prefix`: the export's ("" or a valid session name prefix). The limits are
  // parameters for tests.
  explicit ItemExportSource(std::string prefix, size_t max_items = kMaxItems,
                            size_t max_bytes = kMaxBytes)
      : prefix_(std::move(prefix)), max_items_(max_items), max_bytes_(max_bytes) {}

  // Keeps `item`. INVALID_ARGUMENT naming the item and the rule: a name that is no
  // session name or is outside the prefix, a spec that is not resolved, qparams whose
  // sizes disagree with their shape, or (initialized) a shape the granularity's axes
  // do not fit. RESOURCE_EXHAUSTED beyond the limits. Before Seal only.
  absl::Status Add(ExportItem item);

  // Puts the items in name order. INVALID_ARGUMENT naming a name given twice.
  absl::Status Seal();

  // Over the sealed items.
  std::unique_ptr<ExportPass> NewPass() const override;

  // What an item counts toward kMaxBytes: its name and qparams' values, and about
  // 1 KiB for the rest (the item and its allocations). The vector of items may hold up
  // to twice that while it grows.
  static size_t HeldBytes(const ExportItem& item);

 private:
  class Pass;

  const std::string prefix_;
  const size_t max_items_;
  const size_t max_bytes_;
  std::vector<ExportItem> items_;
  size_t bytes_ = 0;
};

}  // namespace qparams

#endif  // QPARAMS_EXPORT_ITEM_EXPORT_SOURCE_H_
