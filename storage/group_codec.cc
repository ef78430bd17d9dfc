#include "storage/group_codec.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/timestamp.h"

namespace qparams {

namespace sv1 = storage::v1;

sv1::Record EncodeGroupCreate(absl::string_view tenant, const ScaleGroupInfo& group) {
  sv1::Record record;
  sv1::ScaleGroup* out = record.mutable_group_create();
  out->mutable_key()->set_tenant(std::string(tenant));
  out->mutable_key()->set_name(group.name);
  out->mutable_members()->Assign(group.members.begin(), group.members.end());
  out->set_share(group.share == GroupShare::kGlobalAmax ? sv1::GLOBAL_AMAX : sv1::UNION_RANGE);
  out->set_fill_uncalibrated(group.fill_uncalibrated);
  *out->mutable_create_time() = TimestampFromTime(group.create_time);
  return record;
}

sv1::Record EncodeGroupDelete(absl::string_view tenant, absl::string_view name) {
  sv1::Record record;
  record.mutable_group_delete()->set_tenant(std::string(tenant));
  record.mutable_group_delete()->set_name(std::string(name));
  return record;
}

absl::StatusOr<DecodedGroup> DecodeGroup(const sv1::ScaleGroup& record) {
  DecodedGroup out;
  out.tenant = record.key().tenant();
  out.group.name = record.key().name();
  switch (record.share()) {
    case sv1::GLOBAL_AMAX:
      out.group.share = GroupShare::kGlobalAmax;
      break;
    case sv1::UNION_RANGE:
      out.group.share = GroupShare::kUnionRange;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("scale group \"", out.group.name, "\" (tenant \"", out.tenant,
                       "\"): share is ", record.share(), ", not GLOBAL_AMAX or UNION_RANGE"));
  }
  out.group.members.assign(record.members().begin(), record.members().end());
  out.group.fill_uncalibrated = record.fill_uncalibrated();
  out.group.create_time = TimeFromTimestamp(record.create_time());
  return out;
}

}  // namespace qparams
