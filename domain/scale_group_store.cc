#include "domain/scale_group_store.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace qparams {
namespace {

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("scale group \"", name, "\" does not exist"));
}

}  // namespace

std::string ScaleGroupStore::MapKey(absl::string_view tenant, absl::string_view name) {
  return absl::StrCat(tenant, std::string(1, '\0'), name);
}

absl::Status ScaleGroupStore::Create(absl::string_view tenant, const ScaleGroupInfo& group) {
  const std::string key = MapKey(tenant, group.name);
  absl::MutexLock lock(&mu_);
  if (groups_.contains(key)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "scale group \"", group.name, "\" already exists; delete it first or pick another name"));
  }
  if (static_cast<int64_t>(groups_.size()) >= max_groups_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the server holds ", groups_.size(),
                     " scale groups, its limit (--max_scale_groups); delete unused groups first"));
  }
  groups_.emplace(key, group);
  return absl::OkStatus();
}

absl::StatusOr<ScaleGroupInfo> ScaleGroupStore::Find(absl::string_view tenant,
                                                     absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = groups_.find(MapKey(tenant, name));
  if (it == groups_.end()) return NotFound(name);
  return it->second;
}

absl::Status ScaleGroupStore::Erase(absl::string_view tenant, absl::string_view name) {
  absl::MutexLock lock(&mu_);
  if (groups_.erase(MapKey(tenant, name)) == 0) return NotFound(name);
  return absl::OkStatus();
}

ScaleGroupStore::Page ScaleGroupStore::List(absl::string_view tenant, absl::string_view prefix,
                                            absl::string_view after, int limit) const {
  Page page;
  const std::string start = MapKey(tenant, prefix);
  const std::string resume = MapKey(tenant, after);
  absl::ReaderMutexLock lock(&mu_);
  auto it = after.empty() || resume < start ? groups_.lower_bound(start)
                                            : groups_.upper_bound(resume);
  for (; it != groups_.end() && absl::StartsWith(it->first, start); ++it) {
    if (static_cast<int>(page.groups.size()) == limit) {
      page.more = true;
      break;
    }
    page.groups.push_back(it->second);
  }
  return page;
}

}  // namespace qparams
