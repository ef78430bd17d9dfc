"""The gRPC channel of a qparams.Client: its credentials and options, from the
Client's TLS and message size arguments.

Both the Client and the helper process of a forked child (qparams/_fork_proxy.py)
open channels from these arguments, the helper for the child's client, so that
neither imports the other.
"""

from __future__ import annotations

from typing import Any

import grpc

__all__ = ["ChannelOptions", "channel_settings", "open_channel"]

#: gRPC channel options, as grpc.insecure_channel and grpc.secure_channel take them.
ChannelOptions = list[tuple[str, Any]]


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"{what} {path!r} cannot be read: {e.strerror}") from None


def channel_settings(tls: bool, tls_ca: str | None, tls_cert: str | None, tls_key: str | None,
                     tls_server_name: str | None, max_message_bytes: int
                     ) -> tuple[grpc.ChannelCredentials | None, ChannelOptions]:
    """The credentials (None: no TLS) and options of a channel, as qparams.Client's
    arguments of these names describe them; the TLS files are read now.

    Raises:
        ValueError: an unreadable TLS file, or tls_server_name without TLS.
    """
    options: ChannelOptions = [("grpc.max_send_message_length", max_message_bytes),
                               ("grpc.max_receive_message_length", max_message_bytes)]
    credentials = None
    if tls or tls_ca or tls_cert:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_read(tls_ca, "tls_ca") if tls_ca else None,
            private_key=_read(tls_key, "tls_key") if tls_key else None,
            certificate_chain=_read(tls_cert, "tls_cert") if tls_cert else None)
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
    elif tls_server_name:
        raise ValueError("tls_server_name needs TLS (tls, tls_ca or tls_cert)")
    return credentials, options


def open_channel(target: str, credentials: grpc.ChannelCredentials | None,
                 options: ChannelOptions) -> grpc.Channel:
    """A channel to `target` with channel_settings' credentials and options."""
    if credentials is not None:
        return grpc.secure_channel(target, credentials, options)
    return grpc.insecure_channel(target, options)
