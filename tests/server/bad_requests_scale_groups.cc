// The bad requests of the scale groups' calls (nvfp4.md 4.1, 4.2;
// docs/scale_groups.md#errors, whose every error has a row here).

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/scale_group.h"
#include "tests/server/bad_request_table.h"

namespace qparams::testing::bad_request {

std::vector<Row> ScaleGroupRows(const Tokens& tokens) {
  Table table;
  const std::string long_name(129, 'a');

  // ---- Scale groups (nvfp4.md 4.1, 4.2; docs/scale_groups.md) ----
  const int kGlobalAmax = v1::ScaleGroup::GLOBAL_AMAX;
  const int kUnionRange = v1::ScaleGroup::UNION_RANGE;
  auto group = [&](std::string what, v1::CreateScaleGroupRequest r, StatusCode code,
                   std::string field) {
    table.Add(std::move(what), Method::kCreateScaleGroup, std::move(r), code, std::move(field));
  };
  const std::vector<std::string> qk = {kGrpQ, kGrpK};
  // 4.1, in the order of its table.
  group("an existing name", GroupReq(kGroupQk, qk, kGlobalAmax), kExists, kGroupQk);
  group("an existing name with other members and share", GroupReq(kGroupQk, {kGrpUa}, kUnionRange),
        kExists, kGroupQk);
  for (const auto& [what, name] : std::vector<std::pair<std::string, std::string>>{
           {"empty", ""},
           {"of 129 characters", long_name},
           {"with a space", "hgrp/g x"},
           {"with a colon", "hgrp:g"},
           {"with a newline", "hgrp/g\n"},
           {"with a NUL byte", std::string("hgrp/g\0x", 8)},
           {"with a non-ASCII byte", "hgrp/g\xc3\xa9"},
           {"with a bracket", "hgrp/g[0]"}}) {
    group(absl::StrCat("name ", what), GroupReq(name, qk, kGlobalAmax), kInvalid, "group.name");
    table.Add(absl::StrCat("name ", what), Method::kGetScaleGroup,
              Named<v1::GetScaleGroupRequest>(name), kInvalid, "name");
    table.Add(absl::StrCat("name ", what), Method::kDeleteScaleGroup,
              Named<v1::DeleteScaleGroupRequest>(name), kInvalid, "name");
    table.Add(absl::StrCat("name ", what), Method::kGetGroupQParams,
              Named<v1::GetGroupQParamsRequest>(name), kInvalid, "name");
    if (!name.empty()) {
      group(absl::StrCat("member ", what), GroupReq("hgrp/g.new", {kGrpQ, name}, kGlobalAmax),
            kInvalid, "group.members[1]");
      table.Add(absl::StrCat("filter ", what), Method::kListScaleGroups, ListGroupsReq(0, "", name),
                kInvalid, "filter");
    }
  }
  group("member empty", GroupReq("hgrp/g.new", {kGrpQ, ""}, kGlobalAmax), kInvalid,
        "group.members[1]");
  group("members empty", GroupReq("hgrp/g.new", {}, kGlobalAmax), kInvalid, "group.members");
  group("a duplicated member", GroupReq("hgrp/g.new", {kGrpQ, kGrpK, kGrpQ}, kGlobalAmax), kInvalid,
        absl::StrCat("\"", kGrpQ, "\" twice"));
  group("one member twice and nothing else", GroupReq("hgrp/g.new", {kGrpUa, kGrpUa}, kUnionRange),
        kInvalid, "twice");
  {
    std::vector<std::string> many;
    for (int i = 0; i <= kMaxGroupMembers; ++i) many.push_back(absl::StrCat("hgrp/m", i));
    group("1025 members (kMaxGroupMembers + 1)", GroupReq("hgrp/g.new", many, kGlobalAmax),
          kInvalid, "group.members has 1025");
    // 1024 pass the count; the first of them then does not exist.
    many.pop_back();
    group("1024 members that do not exist", GroupReq("hgrp/g.new", many, kGlobalAmax), kNotFound,
          "group.members[0]");
  }
  group("share unset", GroupReq("hgrp/g.new", qk, v1::ScaleGroup::SHARE_UNSPECIFIED), kInvalid,
        "group.share");
  group("share an unknown enum value 7", GroupReq("hgrp/g.new", qk, 7), kInvalid, "group.share");
  group("share a negative enum value", GroupReq("hgrp/g.new", qk, -1), kInvalid, "group.share");
  group("a member that does not exist", GroupReq("hgrp/g.new", {kGrpQ, "hgrp/none"}, kGlobalAmax),
        kNotFound, "group.members[1]: session \"hgrp/none\" does not exist");
  group("a member deleted before (doomed)",
        GroupReq("hgrp/g.new", {kGrpUa, kGrpDoomed}, kUnionRange), kNotFound, kGrpDoomed);
  group("a member only tenant B has", GroupReq("hgrp/g.new", {kGrpQ, kBOnly}, kGlobalAmax),
        kNotFound, kBOnly);
  {
    Row row{"tenant B naming tenant A's session",
            Method::kCreateScaleGroup,
            GroupReq("hgrp/g.new", {kGrpQ, kGrpK}, kGlobalAmax),
            kNotFound,
            kGrpK,
            true};
    table.Add(std::move(row));
  }
  group("specs differ in granularity only (u.a per_tensor, u.b now per_channel)",
        GroupReq("hgrp/g.new", {kGrpUa, kGrpUb}, kUnionRange), kInvalid,
        "granularity per_tensor vs per_channel(axis=0)");
  group("specs differ in convention only", GroupReq("hgrp/g.new", {kGrpQ, kNvfp4Mo}, kGlobalAmax),
        kInvalid, "convention compressed_tensors vs modelopt");
  group("specs differ in dtype", GroupReq("hgrp/g.new", {kGrpUa, kExport}, kUnionRange), kInvalid,
        "dtype int8 vs int4");
  group("specs differ in dtype and the rest",
        GroupReq("hgrp/g.new", {kGrpUa, kMovingAvg}, kUnionRange), kInvalid, "dtype int8 vs uint8");
  group("GLOBAL_AMAX on an int8 spec", GroupReq("hgrp/g.new", {kGrpUa}, kGlobalAmax), kInvalid,
        "scale_dtype float8_e4m3fn");
  group("GLOBAL_AMAX on an int4 spec", GroupReq("hgrp/g.new", {kExport}, kGlobalAmax), kInvalid,
        "GLOBAL_AMAX");
  group("UNION_RANGE on a float8_e4m3fn spec", GroupReq("hgrp/g.new", qk, kUnionRange), kInvalid,
        "scale_dtype float8_e4m3fn");
  group("UNION_RANGE on per_channel", GroupReq("hgrp/g.new", {kStatic}, kUnionRange), kInvalid,
        "granularity per_channel(axis=1)");
  group("UNION_RANGE on per_block", GroupReq("hgrp/g.new", {kBlock}, kUnionRange), kInvalid,
        "UNION_RANGE");
  group("a valid group beyond --max_scale_groups", GroupReq("hgrp/g.new", qk, kGlobalAmax),
        kExhausted, "--max_scale_groups");

  // Get / Delete / GetGroupQParams of groups that do not exist, for the caller.
  for (Method method :
       {Method::kGetScaleGroup, Method::kDeleteScaleGroup, Method::kGetGroupQParams}) {
    auto named = [method](const std::string& name) -> Request {
      switch (method) {
        case Method::kGetScaleGroup:
          return Named<v1::GetScaleGroupRequest>(name);
        case Method::kDeleteScaleGroup:
          return Named<v1::DeleteScaleGroupRequest>(name);
        default:
          return Named<v1::GetGroupQParamsRequest>(name);
      }
    };
    table.Add("unknown group", method, named("hgrp/g.none"), kNotFound, "hgrp/g.none");
    table.Add("a session's name, not a group's", method, named(kStatic), kNotFound, kStatic);
    table.Add("tenant B's group", method, named(kGroupB), kNotFound, kGroupB);
    table.Add(
        {"tenant A's group, as tenant B", method, named(kGroupQk), kNotFound, kGroupQk, true});
    table.Add("a group name differing in case", method, named("hgrp/G.qk"), kNotFound, "hgrp/G.qk");
  }
  // 4.2, steps 2 and 4.
  table.Add("a member deleted under the group", Method::kGetGroupQParams,
            Named<v1::GetGroupQParamsRequest>(kGroupOrphan), kPrecondition,
            absl::StrCat("member \"", kGrpDoomed, "\""));
  table.Add("a member whose granularity changed since", Method::kGetGroupQParams,
            Named<v1::GetGroupQParamsRequest>(kGroupDrift), kPrecondition,
            absl::StrCat("member \"", kGrpUb, "\""));
  table.Add("members' input dtypes differ (f32, bf16)", Method::kGetGroupQParams,
            Named<v1::GetGroupQParamsRequest>(kGroupDtypes), kPrecondition, "input dtypes differ");
  table.Add("a calibrated histogram member keeps no range", Method::kGetGroupQParams,
            Named<v1::GetGroupQParamsRequest>(kGroupHist), kPrecondition,
            absl::StrCat("member \"", kHist, "\""));

  // ListScaleGroups: paging as ListSessions.
  auto list_groups = [&](std::string what, v1::ListScaleGroupsRequest r, std::string field) {
    table.Add(std::move(what), Method::kListScaleGroups, std::move(r), kInvalid, std::move(field));
  };
  list_groups("negative page_size", ListGroupsReq(-1, "", ""), "page_size");
  list_groups("page_size INT32_MIN",
              ListGroupsReq(std::numeric_limits<int32_t>::min(), "", kGroupPrefix), "page_size");
  list_groups("a garbage page token", ListGroupsReq(0, "garbage", ""), "page_token");
  list_groups("a page token that is not base64", ListGroupsReq(0, "%%%", ""), "page_token");
  list_groups(
      "a page token cut short",
      ListGroupsReq(0, tokens.for_groups.substr(0, tokens.for_groups.size() / 2), kGroupPrefix),
      "page_token");
  list_groups("a group page token with another filter", ListGroupsReq(1, tokens.for_groups, ""),
              "page_token was issued for filter");
  list_groups("a group page token with a longer filter",
              ListGroupsReq(1, tokens.for_groups, "hgrp/g.q"), "page_token was issued for filter");
  list_groups("a session page token of another filter", ListGroupsReq(1, tokens.for_prefix, ""),
              "page_token was issued for filter");
  list_groups("filter of 129 characters", ListGroupsReq(0, "", long_name), "filter");
  return table.TakeRows();
}

}  // namespace qparams::testing::bad_request
