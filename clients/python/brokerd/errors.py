"""Typed errors for brokerd's gRPC status codes, with the server's retry hint."""

from __future__ import annotations

from typing import Dict, Optional

import grpc

from brokerd._gen import brokerd_rpc_pb2

_RETRY_INFO = "google.rpc.RetryInfo"
_ERROR_INFO = "google.rpc.ErrorInfo"


class BrokerdError(Exception):
    """A call brokerd refused or failed.

    code is the grpc.StatusCode, message the server's message, retry_after
    the seconds brokerd asked to wait before retrying (RetryInfo: queue full,
    memory budget, draining), or None when it sent no hint. reason and
    metadata are its ErrorInfo (for example the role a refused call needs).
    """

    def __init__(self, code: grpc.StatusCode, message: str, retry_after: Optional[float] = None,
                 reason: str = "", metadata: Optional[Dict[str, str]] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.reason = reason
        self.metadata = dict(metadata or {})

    @property
    def retryable(self) -> bool:
        """Whether the same call may succeed later unchanged."""
        return self.retry_after is not None or self.code in (
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED)


class InvalidArgument(BrokerdError):
    """The request is wrong (a client mistake): do not retry it unchanged."""


class NotFound(BrokerdError):
    """No such model, version or device."""


class AlreadyExists(BrokerdError):
    pass


class PermissionDenied(BrokerdError):
    """The call needs a role this client does not have (metadata names it)."""


class Unauthenticated(BrokerdError):
    pass


class ResourceExhausted(BrokerdError):
    """Queue, memory budget or connection limit full: retry after retry_after."""


class FailedPrecondition(BrokerdError):
    """The model or device is not in a state to serve this (e.g. not loaded)."""


class Unavailable(BrokerdError):
    """brokerd is unreachable or draining: retry (after retry_after when given)."""


class DeadlineExceeded(BrokerdError):
    pass


class Cancelled(BrokerdError):
    pass


class Unimplemented(BrokerdError):
    pass


class Internal(BrokerdError):
    """A bug in brokerd: please report it."""


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhausted,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
    grpc.StatusCode.CANCELLED: Cancelled,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.INTERNAL: Internal,
}


def _details(trailing) -> tuple:
    """RetryInfo delay and ErrorInfo from grpc-status-details-bin."""
    retry_after, reason, metadata = None, "", {}
    for key, value in trailing or ():
        if key != "grpc-status-details-bin":
            continue
        st = brokerd_rpc_pb2.Status()
        try:
            st.ParseFromString(value)
        except Exception:  # a malformed trailer is not worth failing over
            continue
        for any_ in st.details:
            name = any_.type_url.rsplit("/", 1)[-1]
            if name == _RETRY_INFO:
                ri = brokerd_rpc_pb2.RetryInfo()
                ri.ParseFromString(any_.value)
                retry_after = max(ri.retry_delay.seconds + ri.retry_delay.nanos / 1e9, 0.0)
            elif name == _ERROR_INFO:
                ei = brokerd_rpc_pb2.ErrorInfo()
                ei.ParseFromString(any_.value)
                reason, metadata = ei.reason, dict(ei.metadata)
    return retry_after, reason, metadata


def from_rpc_error(err: grpc.RpcError) -> BrokerdError:
    """The typed error for a grpc.RpcError (blocking or asyncio)."""
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    message = err.details() if hasattr(err, "details") else str(err)
    trailing = None
    try:
        trailing = err.trailing_metadata()
    except Exception:
        pass
    retry_after, reason, metadata = _details(trailing)
    cls = _BY_CODE.get(code, BrokerdError)
    e = cls(code, message or "", retry_after, reason, metadata)
    e.__cause__ = err
    return e


def retry_delay(err: BaseException, previous: float = 0.0) -> float:
    """Seconds a well-behaved client waits after err before retrying.

    The server's hint when it sent one (at most 1 s), else doubling from
    5 ms up to 1 s for UNAVAILABLE and RESOURCE_EXHAUSTED, else 0.
    """
    if not isinstance(err, BrokerdError):
        return 0.0
    if err.retry_after is not None:
        return min(err.retry_after, 1.0)
    if err.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
        return min(max(2 * previous, 0.005), 1.0)
    return 0.0
