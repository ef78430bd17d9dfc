"""Exceptions named after the gRPC status codes, one class per code.

Every error the server returns is raised as the class of its code, carrying the code
and the server's message unchanged. Mistakes the client can see before any call are
plain TypeError / ValueError instead.
"""

from __future__ import annotations

import grpc

__all__ = [
    "QParamsError", "Cancelled", "Unknown", "InvalidArgument", "DeadlineExceeded",
    "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal",
    "Unavailable", "DataLoss", "Unauthenticated", "error_from_status", "error_from_rpc",
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

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    def __str__(self) -> str:
        where = "" if self.session is None else f" (session {self.session})"
        return f"{self.code.name}{where}: {self.message}"


def _code_class(code: grpc.StatusCode) -> type[QParamsError]:
    name = "".join(part.capitalize() for part in code.name.split("_"))
    doc = f"The gRPC status {code.name} ({code.value[0]})."
    return type(name, (QParamsError,), {"code": code, "__doc__": doc, "__module__": __name__})


Cancelled = _code_class(grpc.StatusCode.CANCELLED)
Unknown = _code_class(grpc.StatusCode.UNKNOWN)
InvalidArgument = _code_class(grpc.StatusCode.INVALID_ARGUMENT)
DeadlineExceeded = _code_class(grpc.StatusCode.DEADLINE_EXCEEDED)
NotFound = _code_class(grpc.StatusCode.NOT_FOUND)
AlreadyExists = _code_class(grpc.StatusCode.ALREADY_EXISTS)
PermissionDenied = _code_class(grpc.StatusCode.PERMISSION_DENIED)
ResourceExhausted = _code_class(grpc.StatusCode.RESOURCE_EXHAUSTED)
FailedPrecondition = _code_class(grpc.StatusCode.FAILED_PRECONDITION)
Aborted = _code_class(grpc.StatusCode.ABORTED)
OutOfRange = _code_class(grpc.StatusCode.OUT_OF_RANGE)
Unimplemented = _code_class(grpc.StatusCode.UNIMPLEMENTED)
Internal = _code_class(grpc.StatusCode.INTERNAL)
Unavailable = _code_class(grpc.StatusCode.UNAVAILABLE)
DataLoss = _code_class(grpc.StatusCode.DATA_LOSS)
Unauthenticated = _code_class(grpc.StatusCode.UNAUTHENTICATED)

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
    return result
