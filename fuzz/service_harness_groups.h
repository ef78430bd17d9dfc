// The service harness's handlers of the scale-group methods (service_harness.h
// dispatches to them), with the member and group snapshots their checks compare.

#ifndef QPARAMS_FUZZ_SERVICE_HARNESS_GROUPS_H_
#define QPARAMS_FUZZ_SERVICE_HARNESS_GROUPS_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/service_harness_core.h"

namespace qparams::fuzz {

// The group as GetScaleGroup shows it, or an empty message when absent.
inline v1::ScaleGroup GroupSnapshot(Service& s, const std::string& name) {
  v1::GetScaleGroupRequest request;
  request.set_name(name);
  v1::ScaleGroup group;
  if (!Call(s.service, &QParamsServiceImpl::GetScaleGroup, request, &group).ok()) group.Clear();
  return group;
}

inline void CheckGroup(const v1::ScaleGroup& g) {
  Check(!g.name().empty(), "a group without a name", &g);
  Check(g.members_size() >= 1 && g.members_size() <= kMaxGroupMembers,
        "a group with no members or more than kMaxGroupMembers", &g);
  Check(g.share() == v1::ScaleGroup::GLOBAL_AMAX || g.share() == v1::ScaleGroup::UNION_RANGE,
        "a group of an unknown share", &g);
  Check(g.has_create_time(), "a group without a create_time", &g);
}

// The sessions a group request names (the first few: a failed call must change
// none of them).
inline std::vector<v1::Session> MemberSnapshots(Service& s,
                                                const google::protobuf::RepeatedPtrField<std::string>& members) {
  std::vector<v1::Session> out;
  for (int i = 0; i < members.size() && i < 8; ++i) out.push_back(Snapshot(s, members[i]));
  return out;
}

inline void CheckMembersUnchanged(Service& s, const google::protobuf::RepeatedPtrField<std::string>& members,
                                  const std::vector<v1::Session>& before,
                                  const google::protobuf::Message& request) {
  for (size_t i = 0; i < before.size(); ++i) {
    CheckUnchanged(before[i], Snapshot(s, members[static_cast<int>(i)]), request);
  }
}

inline bool HandleCreateScaleGroup(Service& s, const uint8_t* data, size_t size) {
  v1::CreateScaleGroupRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::ScaleGroup& asked = request.group();
  const v1::ScaleGroup before = GroupSnapshot(s, asked.name());
  const std::vector<v1::Session> members = MemberSnapshots(s, asked.members());
  v1::ScaleGroup response;
  const grpc::Status status =
      Call(s.service, &QParamsServiceImpl::CreateScaleGroup, request, &response);
  // Creating a group changes none of its members, whether or not it succeeds.
  CheckMembersUnchanged(s, asked.members(), members, request);
  if (!status.ok()) {
    Check(MessageDifferencer::Equals(before, GroupSnapshot(s, asked.name())),
          "a failed CreateScaleGroup changed the group of that name", &request);
    return true;
  }
  CheckGroup(response);
  Check(before.name().empty(), "CreateScaleGroup replaced an existing group", &request);
  Check(response.name() == asked.name() && response.share() == asked.share() &&
            response.fill_uncalibrated() == asked.fill_uncalibrated() &&
            std::equal(response.members().begin(), response.members().end(),
                       asked.members().begin(), asked.members().end()),
        "CreateScaleGroup answered another group than it was asked for", &response);
  Check(MessageDifferencer::Equals(response, GroupSnapshot(s, asked.name())),
        "GetScaleGroup differs from what CreateScaleGroup answered", &response);
  return true;
}

inline bool HandleGetScaleGroup(Service& s, const uint8_t* data, size_t size) {
  v1::GetScaleGroupRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ScaleGroup response;
  if (Call(s.service, &QParamsServiceImpl::GetScaleGroup, request, &response).ok()) {
    CheckGroup(response);
    Check(response.name() == request.name(), "GetScaleGroup answered another group", &response);
  }
  return true;
}

inline bool HandleListScaleGroups(Service& s, const uint8_t* data, size_t size) {
  v1::ListScaleGroupsRequest request;
  if (!Parse(data, size, &request)) return false;
  v1::ListScaleGroupsResponse response;
  if (!Call(s.service, &QParamsServiceImpl::ListScaleGroups, request, &response).ok()) {
    return true;
  }
  const int limit = request.page_size() == 0
                        ? Engine::kDefaultPageSize
                        : std::min(request.page_size(), Engine::kMaxPageSize);
  Check(response.groups_size() <= limit, "a page of groups larger than page_size", &response);
  for (int i = 0; i < response.groups_size(); ++i) {
    CheckGroup(response.groups(i));
    Check(response.groups(i).name().compare(0, request.filter().size(), request.filter()) == 0,
          "a listed group does not match the filter", &response);
    if (i > 0) {
      Check(response.groups(i - 1).name() < response.groups(i).name(),
            "groups are not in byte order", &response);
    }
  }
  if (!response.next_page_token().empty()) {
    Check(response.groups_size() == limit, "a page of groups before the last is not full",
          &response);
    v1::ListScaleGroupsRequest next = request;
    next.set_page_token(response.next_page_token());
    v1::ListScaleGroupsResponse next_response;
    Check(Call(s.service, &QParamsServiceImpl::ListScaleGroups, next, &next_response).ok(),
          "the groups' next_page_token is refused", &next);
    if (next_response.groups_size() > 0 && response.groups_size() > 0) {
      Check(response.groups(response.groups_size() - 1).name() < next_response.groups(0).name(),
            "the next page of groups does not continue the previous one", &next_response);
    }
  }
  return true;
}

inline bool HandleDeleteScaleGroup(Service& s, const uint8_t* data, size_t size) {
  v1::DeleteScaleGroupRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::ScaleGroup before = GroupSnapshot(s, request.name());
  const std::vector<v1::Session> members = MemberSnapshots(s, before.members());
  v1::DeleteScaleGroupResponse response;
  const grpc::Status status =
      Call(s.service, &QParamsServiceImpl::DeleteScaleGroup, request, &response);
  // Deleting a group never deletes (or changes) its members.
  CheckMembersUnchanged(s, before.members(), members, request);
  if (status.ok()) {
    Check(GroupSnapshot(s, request.name()).name().empty(), "a deleted group is still there",
          &request);
  } else {
    Check(MessageDifferencer::Equals(before, GroupSnapshot(s, request.name())),
          "a failed DeleteScaleGroup changed the group", &request);
  }
  return true;
}

inline bool HandleGetGroupQParams(Service& s, const uint8_t* data, size_t size) {
  v1::GetGroupQParamsRequest request;
  if (!Parse(data, size, &request)) return false;
  const v1::ScaleGroup group = GroupSnapshot(s, request.name());
  const std::vector<v1::Session> members = MemberSnapshots(s, group.members());
  v1::GroupQParams response;
  const grpc::Status status =
      Call(s.service, &QParamsServiceImpl::GetGroupQParams, request, &response);
  CheckMembersUnchanged(s, group.members(), members, request);
  if (!status.ok()) return true;
  Check(!group.name().empty(), "GetGroupQParams answered for a group that does not exist",
        &request);
  Check(response.group() == request.name(), "GetGroupQParams answered another group", &response);
  Check(response.uncalibrated_size() <= group.members_size(),
        "more uncalibrated members than members", &response);
  if (!response.initialized()) {
    Check(response.uncalibrated_size() > 0,
          "an uninitialized group result that names no uncalibrated member", &response);
    return true;
  }
  if (group.share() == v1::ScaleGroup::GLOBAL_AMAX) {
    Check(response.members_size() == group.members_size(),
          "a GLOBAL_AMAX result without one entry per member", &response);
    for (int i = 0; i < response.members_size(); ++i) {
      Check(response.members(i).name() == group.members(i),
            "a GLOBAL_AMAX result's members are not in member order", &response);
      if (response.members(i).has_amax()) CheckQParams(response.members(i).qparams(), response);
    }
  } else {
    CheckQParams(response.qparams(), response);
    Check(response.qparams().shape_size() == 1 && response.qparams().shape(0) == 1,
          "a UNION_RANGE result whose qparams are not of shape [1]", &response);
    Check(!(response.min() > response.max()), "a union range with min > max", &response);
  }
  return true;
}

}  // namespace qparams::fuzz

#endif  // QPARAMS_FUZZ_SERVICE_HARNESS_GROUPS_H_
