// The group subcommands: scale groups, named lists of sessions that share their
// scales (docs/scale_groups.md).

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/scale_group.h"
#include "proto/convert.h"
#include "tools/cli_internal.h"

namespace qparams::cli {
namespace {

// The share --share names, by the core's names of the shares (global_amax,
// union_range), any case; nullopt for another.
std::optional<v1::ScaleGroup::Share> ParseShare(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  for (GroupShare share : {GroupShare::kGlobalAmax, GroupShare::kUnionRange}) {
    if (lower == GroupShareName(share)) return wire::GroupShareToProto(share);
  }
  return std::nullopt;
}

}  // namespace

int GroupCreate(Invocation& in) {
  const Options& o = in.options();
  if (o.members.empty()) {
    return Usage(in.err(), "--members: group create needs the member sessions, --members=A,B,...");
  }
  v1::ScaleGroup group;
  group.set_name(in.arg(0));
  for (absl::string_view member : absl::StrSplit(o.members, ',')) {
    if (member.empty()) {
      return Usage(in.err(), absl::StrCat("--members: \"", o.members,
                                          "\" has an empty name; separate names by one comma"));
    }
    group.add_members(std::string(member));
  }
  if (o.share.empty()) {
    return Usage(in.err(), "--share: group create needs --share=global_amax or union_range");
  }
  const std::optional<v1::ScaleGroup::Share> share = ParseShare(o.share);
  if (!share) {
    return Usage(in.err(),
                 absl::StrCat("--share: \"", o.share, "\" is not global_amax or union_range"));
  }
  group.set_share(*share);
  group.set_fill_uncalibrated(o.fill_uncalibrated);
  return in.PrintResult(in.client().CreateScaleGroup(group));
}

int GroupGet(Invocation& in) { return in.PrintResult(in.client().GetScaleGroup(in.arg(0))); }

// Every group under --filter, following the pages (of --page_size) to the last:
// JSON, one ListScaleGroupsResponse holding them all.
int GroupList(Invocation& in) {
  const Options& o = in.options();
  if (!o.page_token.empty()) {
    return Usage(in.err(), "--page_token: group list follows every page; it takes none");
  }
  v1::ListScaleGroupsResponse all;
  const absl::Status status =
      in.client().ReadScaleGroups(o.filter, o.page_size, [&all](const v1::ScaleGroup& group) {
        *all.add_groups() = group;
        return absl::OkStatus();
      });
  const std::vector<std::string> unreachable = UnreachableReplicas(status);
  if (!status.ok() && unreachable.empty()) return in.Fail(status);
  all.mutable_unreachable_replicas()->Assign(unreachable.begin(), unreachable.end());
  in.Print(all);
  return status.ok() ? kExitOk : in.Fail(status);
}

int GroupDelete(Invocation& in) {
  const absl::Status status = in.client().DeleteScaleGroup(in.arg(0));
  if (!status.ok()) return in.Fail(status);
  if (in.table()) {
    in.out() << "deleted group " << in.arg(0) << "\n";
  } else {
    PrintJson(v1::DeleteScaleGroupResponse(), in.out());
  }
  return kExitOk;
}

int GroupQParams(Invocation& in) { return in.PrintResult(in.client().GetGroupQParams(in.arg(0))); }

}  // namespace qparams::cli
