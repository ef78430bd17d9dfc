// Scale groups in the on-disk format (qparams.storage.v1): the records of a group's
// creation and deletion. A group is only names (nvfp4.md §4), so a record decodes
// whatever sessions exist; the domain checks the names (ScaleGroupStore::Replay).
//
// The storage format has its own messages (storage/qparams/storage/v1/storage.proto),
// so this codec is the only translation between them and a group's values; it knows
// nothing of the wire contract.

#ifndef QPARAMS_STORAGE_GROUP_CODEC_H_
#define QPARAMS_STORAGE_GROUP_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "core/scale_group.h"
#include "qparams/storage/v1/storage.pb.h"

namespace qparams {

// A scale group as created: the domain's value (domain/scale_group_store.h) and what
// its creation record holds, with the tenant beside it.
struct ScaleGroupInfo {
  std::string name;
  std::vector<std::string> members;  // session names of the group's tenant, in order
  GroupShare share = GroupShare::kGlobalAmax;
  bool fill_uncalibrated = false;
  absl::Time create_time;
};

// The records of a group's creation under `tenant` and of its deletion.
storage::v1::Record EncodeGroupCreate(absl::string_view tenant, const ScaleGroupInfo& group);
storage::v1::Record EncodeGroupDelete(absl::string_view tenant, absl::string_view name);

struct DecodedGroup {
  std::string tenant;
  ScaleGroupInfo group;
};

// INVALID_ARGUMENT (naming the group) for a share that is not GLOBAL_AMAX or
// UNION_RANGE.
absl::StatusOr<DecodedGroup> DecodeGroup(const storage::v1::ScaleGroup& record);

}  // namespace qparams

#endif  // QPARAMS_STORAGE_GROUP_CODEC_H_
