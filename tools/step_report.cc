#include "tools/step_report.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json_string.h"

namespace qparams::report {
namespace {

// A step's entry in a table cell, before consecutive steps are joined.
struct StepEntry {
  int64_t step;
  int32_t world_size;
  std::vector<int32_t> ranks;  // waited for, or missing
};

// `entries` (ascending steps) as "STEPS (WORDS RANKS)", consecutive steps of one
// world size and the same ranks as one FIRST-LAST entry, joined by "; "; "-" for
// none. A step of world size 0 was contributed by nobody: "missing all".
std::string Cell(const std::vector<StepEntry>& entries, absl::string_view words) {
  if (entries.empty()) return "-";
  std::vector<std::string> cells;
  for (size_t i = 0; i < entries.size();) {
    size_t j = i + 1;
    while (j < entries.size() && entries[j].step == entries[j - 1].step + 1 &&
           entries[j].world_size == entries[i].world_size && entries[j].ranks == entries[i].ranks) {
      ++j;
    }
    const std::string steps = j - i == 1 ? absl::StrCat(entries[i].step)
                                         : absl::StrCat(entries[i].step, "-", entries[j - 1].step);
    const std::string ranks = entries[i].world_size == 0 ? "all" : RankRanges(entries[i].ranks);
    cells.push_back(absl::StrCat(steps, " (", words, " ", ranks, ")"));
    i = j;
  }
  return absl::StrJoin(cells, "; ");
}

std::string JsonRanks(const google::protobuf::RepeatedField<int32_t>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

std::string JsonRanks(const std::set<int32_t>& ranks) {
  return absl::StrCat("[", absl::StrJoin(ranks, ", "), "]");
}

std::string OrDash(std::string text) { return text.empty() ? "-" : text; }

}  // namespace

std::string RankRanges(std::vector<int32_t> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::vector<std::string> runs;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i + 1;
    while (j < ranks.size() && ranks[j] == ranks[j - 1] + 1) ++j;
    runs.push_back(j - i == 1 ? absl::StrCat(ranks[i]) : absl::StrCat(ranks[i], "-", ranks[j - 1]));
    i = j;
  }
  return absl::StrJoin(runs, ",");
}

StepReport::StepReport(std::string prefix, Format format, std::ostream& out)
    : prefix_(std::move(prefix)), format_(format), out_(out) {
  if (format_ == Format::kJson) {
    out_ << "{\n \"prefix\": " << JsonString(prefix_) << ",\n \"sessions\": [";
  }
}

void StepReport::Add(const v1::Session& session) {
  if (format_ == Format::kJson) AddJson(session);
  ++sessions_;
  if (!session.has_steps()) {
    if (format_ == Format::kTable) rows_.push_back({session.name(), "-", "-", "-"});
    return;
  }
  const v1::StepProgress& steps = session.steps();
  ++stepped_;
  const int64_t applied = steps.last_applied_step();
  min_applied_ = std::min(min_applied_.value_or(applied), applied);
  max_applied_ = std::max(max_applied_.value_or(applied), applied);
  if (!steps.incomplete().empty()) ++with_incomplete_;
  std::vector<StepEntry> open, incomplete;
  for (const v1::StepProgress::Pending& step : steps.pending()) {
    waiting_.insert(step.missing_ranks().begin(), step.missing_ranks().end());
    open.push_back(
        {step.step(), step.world_size(),
         std::vector<int32_t>(step.missing_ranks().begin(), step.missing_ranks().end())});
  }
  for (const v1::StepProgress::Incomplete& step : steps.incomplete()) {
    missing_.insert(step.missing_ranks().begin(), step.missing_ranks().end());
    incomplete.push_back(
        {step.step(), step.world_size(),
         std::vector<int32_t>(step.missing_ranks().begin(), step.missing_ranks().end())});
  }
  if (format_ == Format::kTable) {
    rows_.push_back({session.name(), absl::StrCat(applied), Cell(open, "waiting for"),
                     Cell(incomplete, "missing")});
  }
}

void StepReport::AddJson(const v1::Session& session) {
  const v1::StepProgress& steps = session.steps();  // the default when not stepped
  out_ << (sessions_ == 0 ? "\n  " : ",\n  ") << "{\"name\": " << JsonString(session.name())
       << ", \"stepped\": " << (session.has_steps() ? "true" : "false")
       << ", \"last_applied_step\": " << (session.has_steps() ? steps.last_applied_step() : -1)
       << ", \"open\": [";
  for (int i = 0; i < steps.pending_size(); ++i) {
    const v1::StepProgress::Pending& step = steps.pending(i);
    out_ << (i == 0 ? "" : ", ") << "{\"step\": " << step.step()
         << ", \"world_size\": " << step.world_size()
         << ", \"waiting_for_ranks\": " << JsonRanks(step.missing_ranks()) << "}";
  }
  out_ << "], \"incomplete\": [";
  for (int i = 0; i < steps.incomplete_size(); ++i) {
    const v1::StepProgress::Incomplete& step = steps.incomplete(i);
    out_ << (i == 0 ? "" : ", ") << "{\"step\": " << step.step()
         << ", \"world_size\": " << step.world_size()
         << ", \"missing_ranks\": " << JsonRanks(step.missing_ranks()) << "}";
  }
  out_ << "]}";
}

void StepReport::Finish() {
  if (format_ == Format::kJson) {
    auto number = [](const std::optional<int64_t>& value) {
      return value.has_value() ? absl::StrCat(*value) : std::string("null");
    };
    out_ << (sessions_ == 0 ? "" : "\n ") << "],\n \"session_count\": " << sessions_
         << ",\n \"stepped_count\": " << stepped_
         << ",\n \"last_applied_step_min\": " << number(min_applied_)
         << ",\n \"last_applied_step_max\": " << number(max_applied_)
         << ",\n \"sessions_with_incomplete_steps\": " << with_incomplete_
         << ",\n \"missing_ranks\": " << JsonRanks(missing_)
         << ",\n \"waiting_for_ranks\": " << JsonRanks(waiting_) << "\n}\n";
    return;
  }
  std::vector<std::vector<std::string>> rows;
  rows.reserve(1 + rows_.size());
  rows.push_back({"NAME", "LAST_APPLIED", "OPEN", "CLOSED_INCOMPLETE"});
  for (std::vector<std::string>& row : rows_) rows.push_back(std::move(row));
  rows_.clear();
  PrintColumns(rows, out_);
  out_ << "sessions " << sessions_ << "  stepped " << stepped_ << "  last_applied "
       << (min_applied_.has_value() ? absl::StrCat(*min_applied_, "..", *max_applied_) : "-")
       << "  with_incomplete " << with_incomplete_ << "  missing_ranks "
       << OrDash(RankRanges({missing_.begin(), missing_.end()})) << "  waiting_for_ranks "
       << OrDash(RankRanges({waiting_.begin(), waiting_.end()})) << "\n";
}

}  // namespace qparams::report
