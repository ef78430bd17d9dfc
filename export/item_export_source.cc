#include "export/item_export_source.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/qparams.h"
#include "core/status_macros.h"
#include "core/tensor.h"
#include "domain/session_store.h"

namespace qparams {
namespace {

// The item itself and its allocations' overhead: about 1 KiB (a render of 10,000
// items of 16 channels grew the server's peak RSS by 29 MiB, gRPC's buffers included).
constexpr size_t kItemOverhead = sizeof(ExportItem) + 256;

absl::Status Malformed(const ExportItem& item, absl::string_view rule) {
  return absl::InvalidArgumentError(absl::StrCat("export item ", item.session.name, ": ", rule));
}

// Whether the axis (negative: from the end) names one of `rank` axes.
bool AxisFits(int64_t axis, size_t rank) {
  const int64_t r = static_cast<int64_t>(rank);
  return axis >= -r && axis < r;
}

// What rendering indexes by: the qparams' sizes agree with their shape, and (for an
// initialized item but NVFP4's) the granularity's axes name axes of that shape.
absl::Status CheckItem(const ExportItem& item, absl::string_view prefix) {
  const SessionInfo& s = item.session;
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(s.name, "export item name"));
  if (!absl::StartsWith(s.name, prefix)) {
    return Malformed(item, absl::StrCat("its name is not under the prefix \"", prefix, "\""));
  }
  absl::StatusOr<QuantSpec> resolved = s.spec.Resolve();
  if (!resolved.ok()) return Malformed(item, resolved.status().message());
  if (!(*resolved == s.spec)) {
    return Malformed(item, "its spec is not resolved (every default filled in)");
  }
  const QParams& q = s.qparams;
  absl::StatusOr<int64_t> count = NumElements(q.shape, "qparams.shape");
  if (!count.ok()) return Malformed(item, count.status().message());
  const size_t n = static_cast<size_t>(*count);
  if (ScaleCount(q) != n) {
    return Malformed(item, absl::StrCat("it has ", ScaleCount(q), " scales for qparams.shape's ",
                                        n, " elements"));
  }
  // NVFP4's block scales are e4m3 codes only (QParams); other scales are floats.
  if ((!q.scale.empty() && q.scale.size() != n) || q.zero_point.size() != (q.has_zero_point ? n : 0) ||
      q.minval.size() != (q.has_minval ? n : 0) || (!q.scale_e4m3.empty() && q.scale_e4m3.size() != n)) {
    return Malformed(item, "its float or e4m3 scales, zero points or minvals are not one per "
                           "scale (or none)");
  }
  // NVFP4 rendering checks its own layout before it indexes the shape.
  if (!s.initialized || s.spec.nvfp4_scale()) return absl::OkStatus();
  const Granularity& g = s.spec.granularity;
  const size_t rank = q.shape.size();
  const bool fits = g.kind() == Granularity::Kind::kPerTensor ||
                    (g.axis().has_value() ? AxisFits(*g.axis(), rank)
                                          : g.block_size().size() == rank);
  if (!fits) {
    return Malformed(item, absl::StrCat("its granularity ", g.ToString(),
                                        " does not fit qparams of rank ", rank));
  }
  return absl::OkStatus();
}

}  // namespace

class ItemExportSource::Pass final : public ExportPass {
 public:
  explicit Pass(const std::vector<ExportItem>* items) : items_(items) {}

  absl::StatusOr<const ExportItem*> Next() override {
    if (next_ == items_->size()) return nullptr;
    return &(*items_)[next_++];
  }

 private:
  const std::vector<ExportItem>* const items_;
  size_t next_ = 0;
};

size_t ItemExportSource::HeldBytes(const ExportItem& item) {
  const QParams& q = item.session.qparams;
  return kItemOverhead + item.session.name.size() + item.filled_group.size() +
         q.shape.size() * sizeof(int64_t) + q.scale.size() * sizeof(float) +
         q.zero_point.size() * sizeof(int32_t) + q.minval.size() * sizeof(float) +
         q.scale_e4m3.size();
}

absl::Status ItemExportSource::Add(ExportItem item) {
  const size_t bytes = HeldBytes(item);
  if (items_.size() >= max_items_ || bytes > max_bytes_ - bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a render holds at most ", max_items_, " export items and ", max_bytes_,
        " bytes of them; export under narrower prefixes"));
  }
  QPARAMS_RETURN_IF_ERROR(CheckItem(item, prefix_));
  bytes_ += bytes;
  items_.push_back(std::move(item));
  return absl::OkStatus();
}

absl::Status ItemExportSource::Seal() {
  std::sort(items_.begin(), items_.end(), [](const ExportItem& a, const ExportItem& b) {
    return a.session.name < b.session.name;
  });
  for (size_t i = 1; i < items_.size(); ++i) {
    if (items_[i].session.name == items_[i - 1].session.name) {
      return Malformed(items_[i], "the name is given twice");
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<ExportPass> ItemExportSource::NewPass() const {
  return std::make_unique<Pass>(&items_);
}

}  // namespace qparams
