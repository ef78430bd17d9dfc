"""The scale group calls of qparams.Client (docs/scale_groups.md): creating,
reading, listing and deleting groups of sessions that share a scale, and their
shared result."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from qparams._client_core import ClientCore, Metadata
from qparams._results import SHARES, GroupQParams, ScaleGroup
from qparams.v1 import qparams_pb2 as pb

__all__ = ["ScaleGroupCalls"]


class ScaleGroupCalls(ClientCore):
    """qparams.Client's calls on scale groups."""

    def create_scale_group(self, name: str, members: Sequence[str], share: str = "global_amax",
                           *, fill_uncalibrated: bool = False,
                           timeout: float | None = None, metadata: Metadata = None
                           ) -> ScaleGroup:
        """Creates the scale group `name` over the sessions `members` (in this order)
        and returns it; the members are not changed (docs/scale_groups.md).

        Args:
            name: the group's name, in the session name alphabet. Sharded: the group
                and its members must hash to one slot, so name them with one hash
                tag ("{layer0}.qkv" over "{layer0}.q_proj", ...).
            members: 1 to 1024 distinct session names of one resolved spec.
            share: "global_amax" (NVFP4 sessions: one global scale from the largest
                amax) or "union_range" (per_tensor, not NVFP4: one qparams from the
                union of the ranges); case-insensitive.
            fill_uncalibrated: global_amax: once one member is calibrated, the
                uncalibrated ones take the group's global scale instead of leaving the
                group uninitialized.

        Raises:
            TypeError: members is a str, or holds something else than str.
            ValueError: share is not global_amax or union_range (before any call).
            AlreadyExists: the name is taken. NotFound: a member session is missing.
            InvalidArgument: a bad name, empty or repeated members, members whose
                specs differ, a share their spec does not allow, or (sharded)
                members in another slot than the group.
        """
        if isinstance(members, (str, bytes)):
            raise TypeError("members must be a sequence of session names, not a single "
                            f"{type(members).__name__}")
        members = list(members)
        for member in members:
            if not isinstance(member, str):
                raise TypeError(f"members must be session names (str), not "
                                f"{type(member).__name__} {member!r}")
        wire_share = SHARES.get(share.lower()) if isinstance(share, str) else None
        if wire_share is None:
            raise ValueError(f"share {share!r} is not one of {', '.join(SHARES)}")
        request = pb.CreateScaleGroupRequest(group=pb.ScaleGroup(
            name=name, members=members, share=wire_share,
            fill_uncalibrated=bool(fill_uncalibrated)))
        return ScaleGroup.from_proto(
            self._call("CreateScaleGroup", request, timeout, metadata, route=name))

    def get_scale_group(self, name: str, *,
                        timeout: float | None = None, metadata: Metadata = None) -> ScaleGroup:
        """The scale group `name` (NotFound if there is none)."""
        return ScaleGroup.from_proto(self._call(
            "GetScaleGroup", pb.GetScaleGroupRequest(name=name), timeout, metadata))

    def list_scale_groups(self, prefix: str = "", *, page_size: int = 0,
                          timeout: float | None = None, metadata: Metadata = None
                          ) -> Iterator[ScaleGroup]:
        """Every scale group whose name starts with `prefix`, in name order, fetching
        page after page (page_size 0: the server's default of 50; at most 1000).
        Sharded: every replica's, merged in name order by the deployment.

        Raises:
            InvalidArgument: a negative page_size or one above 1000.
            IncompleteListing: sharded, some replicas could not be read (Unavailable,
                DeadlineExceeded, Unknown): raised after the groups of the others.
        """
        pages = self._pages("ListScaleGroups", lambda token: pb.ListScaleGroupsRequest(
            page_size=page_size, page_token=token, filter=prefix),
            lambda page: page.groups, timeout, metadata)
        return (ScaleGroup.from_proto(group) for group in pages)

    def delete_scale_group(self, name: str, *,
                           timeout: float | None = None, metadata: Metadata = None) -> None:
        """Deletes the scale group `name`, never its members (NotFound if there is
        none)."""
        self._call("DeleteScaleGroup", pb.DeleteScaleGroupRequest(name=name), timeout, metadata)

    def get_group_qparams(self, name: str, *,
                          timeout: float | None = None, metadata: Metadata = None
                          ) -> GroupQParams:
        """The shared result of the scale group `name`, computed now from its members'
        current ranges: while a member is uncalibrated (and not filled), `initialized`
        False with the `uncalibrated` members, as get_qparams before the first forward.

        Raises:
            NotFound: no such group.
            FailedPrecondition: a member was deleted, the members' specs no longer
                agree, their input dtypes differ, or a histogram member is
                calibrated (the message names it).
        """
        return GroupQParams.from_proto(self._call(
            "GetGroupQParams", pb.GetGroupQParamsRequest(name=name), timeout, metadata))
