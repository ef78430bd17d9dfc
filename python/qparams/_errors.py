"""Exceptions named after the gRPC status codes, one class per code, declared here
so that type checkers and IDEs see them.

Every error the server returns is raised as the class of its code, carrying the code
and the server's message unchanged. Mistakes the client can see before any call are
plain TypeError / ValueError instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc

__all__ = [
    "QParamsError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal",
    "Unavailable", "DataLoss", "Unauthenticated", "FusedGlobalScalesDiffer",
    "UncalibratedGroup", "IncompleteListing", "error_from_status", "error_from_rpc",
]


class QParamsError(Exception):
    """A call the server (or the transport) answered with a non-OK gRPC status.

    Attributes:
        code: the grpc.StatusCode.
        message: the status message, as the server wrote it.
        session: for an observation sent in the background or in a stream, the
            session it was for; else None.
        owner: for a call a replica refused because another replica owns the
            session (FailedPrecondition in a sharded deployment), that replica, from
            the x-qparams-owner trailing metadata; else None.
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN
    session: str | None = None
    owner: str | None = None

    def __init__(self, message: str, code: grpc.StatusCode | None = None, *,
                 session: str | None = None, owner: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        if session is not None:
            self.session = session
        if owner is not None:
            self.owner = owner

    def __str__(self) -> str:
        where = "" if self.session is None else f" (session {self.session})"
        return f"{self.code.name}{where}: {self.message}"


class Cancelled(QParamsError):
    """gRPC status CANCELLED (1). The call was cancelled (by the client, or the server shut
    down)."""

    code = grpc.StatusCode.CANCELLED


class Unknown(QParamsError):
    """gRPC status UNKNOWN (2). An error the server did not classify, or a status code this
    client does not know."""

    code = grpc.StatusCode.UNKNOWN


class InvalidArgument(QParamsError):
    """gRPC status INVALID_ARGUMENT (3). A request the server refuses whatever its state: a
    bad name, spec, tensor or value."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceeded(QParamsError):
    """gRPC status DEADLINE_EXCEEDED (4). The call's deadline (timeout) passed before the
    server answered."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFound(QParamsError):
    """gRPC status NOT_FOUND (5). No session (or no session under the prefix) of that name
    for the caller's tenant."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(QParamsError):
    """gRPC status ALREADY_EXISTS (6). The session name is taken (or an existing session
    differs from the one asked for)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDenied(QParamsError):
    """gRPC status PERMISSION_DENIED (7). The caller's token does not allow the call."""

    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(QParamsError):
    """gRPC status RESOURCE_EXHAUSTED (8). A limit was reached: message size, tensor
    elements, sessions, batch items."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPrecondition(QParamsError):
    """gRPC status FAILED_PRECONDITION (9). The session's state refuses the call (export
    mode, a fixed shape or dtype, a replica that does not own the session...)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(QParamsError):
    """gRPC status ABORTED (10). The call was aborted by a concurrent change."""

    code = grpc.StatusCode.ABORTED


class OutOfRange(QParamsError):
    """gRPC status OUT_OF_RANGE (11). A value beyond the range the operation accepts."""

    code = grpc.StatusCode.OUT_OF_RANGE


class Unimplemented(QParamsError):
    """gRPC status UNIMPLEMENTED (12). The server does not implement the method (an older
    server)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Internal(QParamsError):
    """gRPC status INTERNAL (13). The server failed internally (storage that stopped
    accepting writes, for one)."""

    code = grpc.StatusCode.INTERNAL


class Unavailable(QParamsError):
    """gRPC status UNAVAILABLE (14). The server could not be reached, or is shutting down;
    the call may be retried."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLoss(QParamsError):
    """gRPC status DATA_LOSS (15). Stored data was found damaged."""

    code = grpc.StatusCode.DATA_LOSS


class Unauthenticated(QParamsError):
    """gRPC status UNAUTHENTICATED (16). The call carried no valid token."""

    code = grpc.StatusCode.UNAUTHENTICATED


class FusedGlobalScalesDiffer(FailedPrecondition):
    """An NVFP4 checkpoint refused because the weights of fused siblings (q/k/v,
    gate/up, an expert's w1/w3: modules an engine loads as one GEMM with one global
    scale) have different global scales: no GLOBAL_AMAX scale group covers them.

    Attributes:
        members: the siblings' sessions (or, for a check made on an exported
            checkpoint, their modules), in the order named.
        global_scales: their global scales, in the same order (empty when the refusal
            did not list them).
    """

    def __init__(self, message: str, members: tuple[str, ...] = (),
                 global_scales: tuple[float, ...] = (), **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.members = tuple(members)
        self.global_scales = tuple(global_scales)


class UncalibratedGroup(FailedPrecondition):
    """An NVFP4 checkpoint refused because a GLOBAL_AMAX scale group has members that
    never saw data, so it has no shared global scale to export (or a filled member is
    a weight, which has no block scales).

    Attributes:
        group: the scale group.
        members: its members, when the refusal listed them (else empty).
        uncalibrated: the members that never saw data.
    """

    def __init__(self, message: str, group: str = "", members: tuple[str, ...] = (),
                 uncalibrated: tuple[str, ...] = (), **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]
        self.group = group
        self.members = tuple(members)
        self.uncalibrated = tuple(uncalibrated)


class IncompleteListing(Unavailable):
    """A listing over every replica of a sharded deployment (list_sessions,
    read_sessions, list_scale_groups) that could not read some replicas: raised
    once every session or group of the replicas that answered was yielded, so that
    a loop over the listing gets what the live replicas hold and cannot miss that
    it is partial.

    Attributes:
        missing: each replica that could not be read, by name, with its error
            (Unavailable, DeadlineExceeded or Unknown, its message naming the
            replica).
    """

    def __init__(self, missing: dict[str, QParamsError], message: str | None = None) -> None:
        self.missing = dict(sorted(missing.items()))
        super().__init__(message or (
            f"the listing is incomplete: {len(self.missing)} replica(s) could not be "
            f"read, so their sessions and groups are not in it: "
            + "; ".join(error.message for error in self.missing.values())))

    @classmethod
    def of(cls, replicas: Iterable[str], message: str | None = None) -> IncompleteListing:
        """The listing that missed `replicas` (known by name only, as a page's
        unreachable_replicas or the x-qparams-unreachable trailer name them);
        `message`: the server's, if it sent one."""
        return cls({r: Unavailable(f"replica {r}: could not be read") for r in replicas},
                   message)


_BY_CODE: dict[grpc.StatusCode, type[QParamsError]] = {
    cls.code: cls
    for cls in (Cancelled, Unknown, InvalidArgument, DeadlineExceeded, NotFound,
                AlreadyExists, PermissionDenied, ResourceExhausted, FailedPrecondition,
                Aborted, OutOfRange, Unimplemented, Internal, Unavailable, DataLoss,
                Unauthenticated)
}
_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def error_from_status(code: int | grpc.StatusCode, message: str) -> QParamsError:
    """The exception of a status, e.g. a stream response's `status` field.

    An unknown numeric code becomes Unknown, with the number in the message.
    """
    if isinstance(code, int):
        status = _BY_NUMBER.get(code)
        if status is None:
            return Unknown(f"(status code {code}) {message}")
        code = status
    return _BY_CODE.get(code, Unknown)(message)


#: The trailing metadata naming the owner of a session another replica owns
#: (wire::kOwnerMetadata, proto/convert.h).
OWNER_METADATA = "x-qparams-owner"
#: The trailing metadata naming the replicas an incomplete listing missed, comma-
#: separated (wire::kUnreachableMetadata, proto/status.h).
UNREACHABLE_METADATA = "x-qparams-unreachable"


def error_from_rpc(error: grpc.RpcError, replica: str | None = None) -> QParamsError:
    """The exception of a failed gRPC call (a grpc.RpcError that is also a grpc.Call),
    with its `owner` from the trailing metadata; for one call of several split by
    replica, the message starts "replica NAME: "."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    details = (error.details() if hasattr(error, "details") else str(error)) or ""
    if replica is not None:
        details = f"replica {replica}: {details}"
    result = error_from_status(code, details)
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == OWNER_METADATA:
            result.owner = value
        elif key == UNREACHABLE_METADATA and isinstance(result, Unavailable):
            result = IncompleteListing.of(value.split(","), details)
    return result
