#include "domain/scale_group_store.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "domain/session_store.h"

namespace qparams {
namespace {

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("scale group \"", name, "\" does not exist"));
}

}  // namespace

absl::Status ValidateGroupMembers(const std::vector<std::string>& members) {
  if (members.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("group.members is empty; a group has 1 to ", kMaxGroupMembers, " members"));
  }
  if (static_cast<int>(members.size()) > kMaxGroupMembers) {
    return absl::InvalidArgumentError(absl::StrCat("group.members has ", members.size(),
                                                   " names; the limit is ", kMaxGroupMembers));
  }
  absl::flat_hash_set<absl::string_view> seen;
  for (size_t i = 0; i < members.size(); ++i) {
    const std::string& member = members[i];
    QPARAMS_RETURN_IF_ERROR(ValidateSessionName(member, absl::StrCat("group.members[", i, "]")));
    if (!seen.insert(member).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("group.members names \"", member, "\" twice; members must be distinct"));
    }
  }
  return absl::OkStatus();
}

std::string ScaleGroupStore::MapKey(absl::string_view tenant, absl::string_view name) {
  return absl::StrCat(tenant, std::string(1, '\0'), name);
}

absl::Status ScaleGroupStore::Create(absl::string_view tenant, const ScaleGroupInfo& group) {
  const std::string key = MapKey(tenant, group.name);
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    if (groups_.contains(key)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "scale group \"", group.name, "\" already exists; delete it first or pick another name"));
    }
    if (static_cast<int64_t>(groups_.size()) >= max_groups_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "the server holds ", groups_.size(),
          " scale groups, its limit (--max_scale_groups); delete unused groups first"));
    }
    QPARAMS_ASSIGN_OR_RETURN(sequence, log_.AppendGroupCreate(tenant, group));
    groups_.emplace(key, group);
  }
  return log_.Sync(sequence);
}

absl::StatusOr<ScaleGroupInfo> ScaleGroupStore::Find(absl::string_view tenant,
                                                     absl::string_view name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = groups_.find(MapKey(tenant, name));
  if (it == groups_.end()) return NotFound(name);
  return it->second;
}

absl::Status ScaleGroupStore::Erase(absl::string_view tenant, absl::string_view name) {
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = groups_.find(MapKey(tenant, name));
    if (it == groups_.end()) return NotFound(name);
    QPARAMS_ASSIGN_OR_RETURN(sequence, log_.AppendGroupDelete(tenant, name));
    groups_.erase(it);
  }
  return log_.Sync(sequence);
}

ScaleGroupStore::Page ScaleGroupStore::List(absl::string_view tenant, absl::string_view prefix,
                                            absl::string_view after, int limit,
                                            const std::function<bool(absl::string_view)>& keep) const {
  Page page;
  const std::string start = MapKey(tenant, prefix);
  const std::string resume = MapKey(tenant, after);
  absl::ReaderMutexLock lock(&mu_);
  auto it = after.empty() || resume < start ? groups_.lower_bound(start)
                                            : groups_.upper_bound(resume);
  for (; it != groups_.end() && absl::StartsWith(it->first, start); ++it) {
    if (keep != nullptr && !keep(it->second.name)) continue;
    if (static_cast<int>(page.groups.size()) == limit) {
      page.more = true;
      break;
    }
    page.groups.push_back(it->second);
  }
  return page;
}

absl::Status ScaleGroupStore::EmitRecords(const Journal::Emitter& emit) const {
  // A batch at a time, in key order, so that a snapshot holds a few groups in memory
  // beside the store, and creations and deletions wait for no write.
  constexpr size_t kBatch = 256;
  std::vector<storage::v1::Record> batch;
  std::string after;
  bool more = true;
  while (more) {
    batch.clear();
    {
      absl::ReaderMutexLock lock(&mu_);
      auto it = after.empty() ? groups_.begin() : groups_.upper_bound(after);
      for (; it != groups_.end() && batch.size() < kBatch; ++it) {
        batch.push_back(EncodeGroupCreate(it->first.substr(0, it->first.find('\0')), it->second));
        after = it->first;
      }
      more = it != groups_.end();
    }
    for (const storage::v1::Record& record : batch) QPARAMS_RETURN_IF_ERROR(emit(record));
  }
  return absl::OkStatus();
}

std::optional<std::string> ScaleGroupStore::Replay(const storage::v1::Record& record) {
  switch (record.kind_case()) {
    case storage::v1::Record::kGroupCreate: {
      const storage::v1::ScaleGroup& created = record.group_create();
      const std::string key = MapKey(created.key().tenant(), created.key().name());
      std::optional<DecodedGroup> decoded;
      std::optional<std::string> problem;
      if (absl::Status name = ValidateSessionName(created.key().name(), "scale group name");
          !name.ok()) {
        problem = absl::StrCat("skipped a record of an invalid ", name.message());
      } else if (absl::StatusOr<DecodedGroup> group = DecodeGroup(created); !group.ok()) {
        problem =
            absl::StrCat("skipped a record that does not restore: ", group.status().message());
      } else if (absl::Status members = ValidateGroupMembers(group->group.members); !members.ok()) {
        problem = absl::StrCat("skipped a record of scale group \"", created.key().name(),
                               "\" that does not restore: ", members.message());
      } else {
        decoded = *std::move(group);
      }
      absl::MutexLock lock(&mu_);
      if (decoded.has_value()) {
        groups_.insert_or_assign(key, std::move(decoded->group));
      } else {
        groups_.erase(key);
      }
      return problem;
    }
    case storage::v1::Record::kGroupDelete: {
      const std::string key = MapKey(record.group_delete().tenant(), record.group_delete().name());
      absl::MutexLock lock(&mu_);
      groups_.erase(key);
      return std::nullopt;
    }
    default:
      return std::nullopt;
  }
}

absl::StatusOr<uint64_t> ScaleGroupStore::Import(const storage::v1::ScaleGroup& record) {
  QPARAMS_RETURN_IF_ERROR(ValidateSessionName(record.key().name(), "scale group name"));
  QPARAMS_ASSIGN_OR_RETURN(DecodedGroup decoded, DecodeGroup(record));
  QPARAMS_RETURN_IF_ERROR(ValidateGroupMembers(decoded.group.members));
  const std::string key = MapKey(decoded.tenant, decoded.group.name);
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    QPARAMS_ASSIGN_OR_RETURN(sequence, log_.AppendGroupCreate(decoded.tenant, decoded.group));
    groups_.insert_or_assign(key, std::move(decoded.group));
  }
  return sequence;
}

std::vector<storage::v1::Record> ScaleGroupStore::RecordsWhere(
    const std::function<bool(absl::string_view)>& keep) const {
  std::vector<storage::v1::Record> records;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [key, group] : groups_) {
    if (keep(group.name)) records.push_back(EncodeGroupCreate(key.substr(0, key.find('\0')), group));
  }
  return records;
}

int64_t ScaleGroupStore::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return groups_.size();
}

}  // namespace qparams
