"""The client's scale-group methods (docs/scale_groups.md) against the real server:
create, get, list and delete round trips, the typed errors of each refusal, paging,
both shares' results, and the routing header of a hash-tagged group name."""

from __future__ import annotations

import concurrent.futures
import datetime

import grpc
import numpy as np
import pytest

import qparams

NVFP4 = dict(target="weight", dtype="float4_e2m1fn_x2", scale_dtype="float8_e4m3fn",
             granularity="per_block:-1:16")
INT8 = dict(target="activation", dtype="int8", qscheme="asymmetric", granularity="per_tensor",
            calculator="global_minmax")


def sessions(client: qparams.Client, names: list[str], spec: dict = NVFP4) -> list[str]:
    for name in names:
        client.create_session(name, **spec)
    return names


def test_create_get_list_delete_round_trip(client) -> None:
    members = sessions(client, ["rt/{l0}.q", "rt/{l0}.k"])
    created = client.create_scale_group("rt/{l0}.qk", members, "GLOBAL_AMAX",
                                        fill_uncalibrated=True)
    assert isinstance(created, qparams.ScaleGroup)
    assert (created.name, created.members, created.share, created.fill_uncalibrated) == (
        "rt/{l0}.qk", ("rt/{l0}.q", "rt/{l0}.k"), "global_amax", True)
    assert isinstance(created.create_time, datetime.datetime)
    assert created.create_time.tzinfo is datetime.timezone.utc
    assert client.get_scale_group("rt/{l0}.qk") == created
    assert list(client.list_scale_groups("rt/")) == [created]
    client.delete_scale_group("rt/{l0}.qk")
    with pytest.raises(qparams.NotFound):
        client.get_scale_group("rt/{l0}.qk")
    assert list(client.list_scale_groups("rt/")) == []
    assert [s.name for s in client.list_sessions("rt/")] == sorted(members)  # kept


def test_global_amax_result(client) -> None:
    members = sessions(client, ["ga/q", "ga/k"])
    client.create_scale_group("ga/qk", members)
    pending = client.get_group_qparams("ga/qk")
    assert isinstance(pending, qparams.GroupQParams)
    assert (pending.group, pending.initialized, pending.uncalibrated, pending.members,
            pending.qparams) == ("ga/qk", False, ("ga/q", "ga/k"), (), None)
    rng = np.random.default_rng(5)
    client.observe("ga/q", rng.standard_normal((2, 32), dtype=np.float32))
    k = client.observe("ga/k", 4 * rng.standard_normal((2, 32), dtype=np.float32)).qparams
    result = client.get_group_qparams("ga/qk")
    assert result.initialized and result.uncalibrated == ()
    assert [m.name for m in result.members] == ["ga/q", "ga/k"]
    for m in result.members:
        assert isinstance(m, qparams.GroupMember) and isinstance(m.qparams, qparams.QParams)
        assert m.qparams.global_scale == result.global_scale and m.amax == m.qparams.amax
    # k has the larger amax, so the group's global scale is k's own.
    assert result.amax == k.amax and result.global_scale == k.global_scale
    assert result.members[1].qparams.scale_e4m3.tolist() == k.scale_e4m3.tolist()


def test_fill_uncalibrated_member(client) -> None:
    members = sessions(client, ["fill/w1", "fill/w3"])
    client.create_scale_group("fill/w13", members, fill_uncalibrated=True)
    client.observe("fill/w1", np.ones((1, 16), np.float32))
    result = client.get_group_qparams("fill/w13")
    assert result.initialized and result.uncalibrated == ("fill/w3",)
    filled = result.members[1]
    assert filled.amax is None and filled.qparams.shape == (0,)
    assert not filled.qparams.initialized and filled.qparams.global_scale == result.global_scale


def test_union_range_result(client) -> None:
    members = sessions(client, ["ur/a", "ur/b"], INT8)
    group = client.create_scale_group("ur/cat", members, "union_range")
    assert group.share == "union_range"
    client.observe("ur/a", np.array([-10.0, 4.0], np.float32))
    client.observe("ur/b", np.array([1.0, 10.0], np.float32))
    result = client.get_group_qparams("ur/cat")
    assert result.initialized and result.members == ()
    assert (result.min, result.max) == (-10.0, 10.0)
    assert isinstance(result.qparams, qparams.QParams) and result.qparams.shape == (1,)
    union = client.compute(np.array([-10.0, 10.0], np.float32), dtype="int8",
                           qscheme="asymmetric", granularity="per_tensor")
    assert result.qparams.scale.tolist() == union.scale.tolist()
    assert result.qparams.zero_point.tolist() == union.zero_point.tolist()


def test_refusals_are_typed_errors(client) -> None:
    members = sessions(client, ["err/a", "err/b"])
    client.create_scale_group("err/g", members)
    with pytest.raises(qparams.AlreadyExists):
        client.create_scale_group("err/g", members)
    with pytest.raises(qparams.NotFound, match="err/missing"):
        client.create_scale_group("err/h", ["err/a", "err/missing"])
    for bad in ([], ["err/a", "err/a"]):
        with pytest.raises(qparams.InvalidArgument):
            client.create_scale_group("err/h", bad)
    with pytest.raises(qparams.InvalidArgument):  # union_range on NVFP4 sessions
        client.create_scale_group("err/h", members, "union_range")
    with pytest.raises(qparams.InvalidArgument):
        client.create_scale_group("bad\nname", members)
    for call in (client.get_scale_group, client.delete_scale_group, client.get_group_qparams):
        with pytest.raises(qparams.NotFound):
            call("err/none")
    with pytest.raises(qparams.InvalidArgument):
        list(client.list_scale_groups("err/", page_size=-1))


def test_deleted_member_fails_the_group(client) -> None:
    members = sessions(client, ["del/a", "del/b"])
    client.create_scale_group("del/g", members)
    client.delete_session("del/b")
    with pytest.raises(qparams.FailedPrecondition, match="del/b"):
        client.get_group_qparams("del/g")
    assert client.get_scale_group("del/g").members == ("del/a", "del/b")


def test_bad_arguments_fail_before_any_call(client) -> None:
    with pytest.raises(ValueError, match="share 'min_max' is not one of global_amax, union_range"):
        client.create_scale_group("arg/g", ["arg/a"], "min_max")
    with pytest.raises(ValueError, match="share"):
        client.create_scale_group("arg/g", ["arg/a"], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="members"):
        client.create_scale_group("arg/g", "arg/a")
    with pytest.raises(TypeError, match="members"):
        client.create_scale_group("arg/g", ["arg/a", 3])  # type: ignore[list-item]


def test_list_follows_pages_under_a_prefix(client) -> None:
    members = sessions(client, ["page/s"])
    names = [f"page/a/{i}" for i in (3, 0, 4, 1, 2)]
    for name in names + ["page/b/0"]:
        client.create_scale_group(name, members)
    listed = list(client.list_scale_groups("page/a/", page_size=2))
    assert [g.name for g in listed] == sorted(names)
    assert all(g.members == ("page/s",) for g in listed)
    assert [g.name for g in client.list_scale_groups("page/")] == sorted(names) + ["page/b/0"]


def test_group_calls_carry_the_group_hash_tag() -> None:
    """A call naming a group sends the hashed part of its name as x-qparams-session,
    as a session's does, so that a balancer routes it to the replica owning the slot
    its members share; listing names none."""
    seen: list[tuple[str, str | None]] = []

    def record(method: str):
        def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
            headers = dict(context.invocation_metadata())
            seen.append((method, headers.get(qparams.client.SESSION_HEADER)))
            context.abort(grpc.StatusCode.UNAVAILABLE, "recorded")
        return grpc.unary_unary_rpc_method_handler(handler)

    methods = ["CreateScaleGroup", "GetScaleGroup", "ListScaleGroups", "DeleteScaleGroup",
               "GetGroupQParams"]  # GetTopology unimplemented: a single server
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "qparams.v1.QParamsService", {m: record(m) for m in methods})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    group = "run/{layer0}.qkv"
    try:
        with qparams.Client(f"127.0.0.1:{port}") as client:
            for call in (lambda: client.create_scale_group(group, ["run/{layer0}.q_proj"]),
                         lambda: client.get_scale_group(group),
                         lambda: client.delete_scale_group(group),
                         lambda: client.get_group_qparams(group),
                         lambda: client.get_scale_group("run/qkv"),
                         lambda: list(client.list_scale_groups("run/"))):
                with pytest.raises(qparams.Unavailable):
                    call()
    finally:
        server.stop(grace=None)
    assert seen == [("CreateScaleGroup", "layer0"), ("GetScaleGroup", "layer0"),
                    ("DeleteScaleGroup", "layer0"), ("GetGroupQParams", "layer0"),
                    ("GetScaleGroup", "run/qkv"), ("ListScaleGroups", None)]
