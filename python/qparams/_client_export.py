"""The exports of qparams.Client: the sessions under a prefix rendered by the server
in a deployment format (docs/exports.md), from every replica when sharded, and the
decoded scale tensors of compressed-tensors and ModelOpt exports."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import grpc

from qparams._client_core import ClientCore, Metadata
from qparams._errors import Aborted, QParamsError, error_from_rpc
from qparams._export import (decode_compressed_tensors, decode_modelopt, refine_export_error,
                             require_torch)
from qparams.v1 import qparams_pb2 as pb

if TYPE_CHECKING:
    import torch

__all__ = ["ExportCalls"]


class ExportCalls(ClientCore):
    """qparams.Client's ExportSessions (and, sharded, RenderExport) calls."""

    def export(self, prefix: str, format: str, *, allow_uninitialized: bool = False,
               tensor_names: Mapping[str, str] | None = None,
               timeout: float | None = None, metadata: Metadata = None) -> str:
        """The sessions under `prefix` rendered by the server (ExportSessions) in a
        deployment format, as one JSON document (docs/exports.md).

        Args:
            prefix: the sessions' name prefix, stripped from the exported names.
            format: "aimet" (AIMET encodings 1.0.0), "onnx" (QuantizeLinear inputs),
                "compressed-tensors" or "modelopt" (NVFP4 scales and
                hf_quant_config.json); the server judges it.
            allow_uninitialized: leave sessions that never saw data out instead of
                failing.
            tensor_names: the exported name of a session's tensor, by the session's
                name without the prefix, e.g. qparams.torch.onnx_tensor_names(model,
                example) for an ONNX graph's names; others keep their names.
            timeout: the call's deadline in seconds (default: the client's).

        Returns:
            The document, decoded from UTF-8.

        Raises:
            TypeError: prefix or format is not a str.
            FailedPrecondition: uninitialized sessions under the prefix (named in the
                message), unless allow_uninitialized.
            FusedGlobalScalesDiffer: (a FailedPrecondition) NVFP4 fused siblings whose
                global scales differ, no GLOBAL_AMAX group covering them; `.members`
                names their sessions.
            UncalibratedGroup: (a FailedPrecondition) a GLOBAL_AMAX group of an
                exported session has members that never saw data (`.uncalibrated`).
            InvalidArgument: an unknown format, a bad prefix, or a session the format
                cannot express (named in the message).
            NotFound: no session under the prefix.
            Aborted: sharded, the slot map kept changing during the export (a move).
            ValueError: the server sent bytes that are not UTF-8.

        Sharded: one document of every replica's sessions, byte for byte a single
        server's (RenderExport over each replica's export items; docs/sharding.md).
        The replicas must serve one slot map epoch before and after their shares are
        read (else a session could be missed or read twice while a slot move
        switches); an export that saw it change is made again on the new topology,
        within the client's retry_total, then raises Aborted.
        """
        for what, value in (("prefix", prefix), ("format", format)):
            if not isinstance(value, str):
                raise TypeError(f"{what} must be a str, not {type(value).__name__}")
        request = pb.ExportSessionsRequest(prefix=prefix, format=format,
                                           allow_uninitialized=bool(allow_uninitialized),
                                           tensor_names=dict(tensor_names or {}))
        # A sharded export that saw the slot map change raises Aborted before any of
        # the document is read: again, on the newer topology, while retry_total allows.
        wait = self._retry.waits()
        while (slot_map := self._router.slot_map()) is not None:
            try:
                return self._export_sharded(request, slot_map.replicas, timeout, metadata)
            except Aborted:
                if not wait():
                    raise
        call = self._stub.ExportSessions(request, timeout=timeout or self.timeout,
                                         metadata=self._addressed(None, metadata))
        try:
            data = b"".join(chunk.data for chunk in call)
        except grpc.RpcError as e:
            raise refine_export_error(error_from_rpc(e)) from None
        finally:
            call.cancel()
        return data.decode("utf-8")

    def _export_sharded(self, request: pb.ExportSessionsRequest, replicas: list[str],
                        timeout: float | None, metadata: Metadata) -> str:
        """export() of a sharded deployment: each replica's share (ExportSessions with
        items, the replicas in name order, one after the other) forwarded into one
        RenderExport call, which checks and renders them all, so that the document
        (and any refusal) is a single server's. A replica's refusal is raised as it
        is (UNAVAILABLE and DEADLINE_EXCEEDED naming the replica), else the
        render's."""
        share = pb.ExportSessionsRequest()
        share.CopyFrom(request)
        share.items = True
        refused: list[tuple[str, grpc.RpcError]] = []
        changed: list[QParamsError] = []  # the epochs' check after the shares
        calls: list[Any] = []
        started = threading.Event()  # calls holds the render

        def requests() -> Iterator[pb.RenderExportRequest]:
            yield pb.RenderExportRequest(options=request)
            for replica in replicas:
                call = self._stub.ExportSessions(share, timeout=timeout or self.timeout,
                                                 metadata=self._addressed(replica, metadata))
                try:
                    for chunk in call:
                        yield pb.RenderExportRequest(items=chunk.items)
                except grpc.RpcError as e:
                    refused.append((replica, e))
                    started.wait()
                    calls[0].cancel()  # the render must not finish without this share
                    return
                finally:
                    call.cancel()
            # The shares hold each session once only if no slot changed owner while
            # they were read: the epoch every replica serves is still the one before.
            try:
                after = self._common_epoch(replicas, timeout, metadata)
                if after != epoch:
                    raise Aborted(f"the slot map changed during the export (epoch {epoch} "
                                  f"-> {after}); export again")
            except QParamsError as e:
                changed.append(e)
                started.wait()
                calls[0].cancel()

        epoch = self._common_epoch(replicas, timeout, metadata)
        render = self._stub.RenderExport(requests(), timeout=timeout or self.timeout,
                                         metadata=self._addressed(replicas[0], metadata))
        calls.append(render)
        started.set()
        def share_error() -> QParamsError:
            # A replica that cannot answer is named; its refusals read as one server's.
            replica, error = refused[0]
            unreachable = error.code() in (grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.DEADLINE_EXCEEDED)
            return refine_export_error(error_from_rpc(error, replica if unreachable else None))

        try:
            data = b"".join(chunk.data for chunk in render)
        except grpc.RpcError as e:
            if changed:
                raise changed[0] from None
            raise (share_error() if refused else refine_export_error(error_from_rpc(e))) from None
        finally:
            render.cancel()
        if changed:
            raise changed[0] from None
        if refused:
            raise share_error() from None
        return data.decode("utf-8")

    def _common_epoch(self, replicas: list[str], timeout: float | None,
                      metadata: Metadata) -> int:
        """The slot map epoch every replica of `replicas` serves (GetTopology of each,
        offered to the router). Raises Aborted naming each one's when they differ (a
        slot move is switching), a replica's error naming it."""
        epochs = []
        for replica in replicas:
            topology = self._call("GetTopology", pb.GetTopologyRequest(), timeout, metadata,
                                  replica)
            self._router.offer(topology)  # the newest map routes the next attempt
            epochs.append(topology.epoch)
        if len(set(epochs)) > 1:
            seen = ", ".join(f"{r} epoch {e}" for r, e in zip(replicas, epochs))
            raise Aborted(f"the replicas serve different slot maps ({seen}): a slot move "
                          f"is switching; export again")
        return epochs[0]

    def export_compressed_tensors(self, prefix: str, *, allow_uninitialized: bool = False,
                                  tensor_names: Mapping[str, str] | None = None,
                                  timeout: float | None = None, metadata: Metadata = None
                                  ) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
        """The sessions under `prefix` as compressed-tensors' scale tensors and
        quantization_config: export(prefix, "compressed-tensors") decoded, for the
        caller to save with their own tooling (e.g. safetensors and config.json).

        Args:
            prefix, allow_uninitialized, tensor_names, timeout, metadata: as for
                export.

        Returns:
            (state_dict, quantization_config): the tensors by name (e.g.
            "fc1.weight_scale", float32; "fc1.weight_zero_point", int8; for NVFP4
            sessions "fc1.weight_scale" as a torch.uint8 tensor of float8_e4m3fn
            bytes, for which qparams.is_e4m3 is true) as torch tensors of the
            exported dtypes and shapes, and the quantization_config object as parsed
            from JSON.

        Raises:
            ImportError: torch is not installed (checked before the call).
            TypeError, FailedPrecondition, InvalidArgument, NotFound: as for export.
            ValueError: a document that is not compressed-tensors' JSON.
        """
        require_torch()
        return decode_compressed_tensors(self.export(
            prefix, "compressed-tensors", allow_uninitialized=allow_uninitialized,
            tensor_names=tensor_names, timeout=timeout, metadata=metadata))

    def export_modelopt(self, prefix: str, *, allow_uninitialized: bool = False,
                        tensor_names: Mapping[str, str] | None = None,
                        timeout: float | None = None, metadata: Metadata = None
                        ) -> tuple[dict[str, "torch.Tensor"], dict[str, Any]]:
        """The NVFP4 sessions (convention modelopt) under `prefix` as ModelOpt's scale
        tensors and hf_quant_config.json content: export(prefix, "modelopt") decoded.

        Args:
            prefix, allow_uninitialized, tensor_names, timeout, metadata: as for
                export.

        Returns:
            (state_dict, hf_quant_config): the tensors by name ("fc1.weight_scale", a
            torch.uint8 tensor of float8_e4m3fn bytes for which qparams.is_e4m3 is
            true; "fc1.weight_scale_2" and "fc1.input_scale", float32 scalars), and
            the hf_quant_config object as parsed from JSON.

        Raises:
            ImportError: torch is not installed (checked before the call).
            TypeError, FailedPrecondition, InvalidArgument, NotFound: as for export.
            ValueError: a document that is not a modelopt export's JSON.
        """
        require_torch()
        return decode_modelopt(self.export(
            prefix, "modelopt", allow_uninitialized=allow_uninitialized,
            tensor_names=tensor_names, timeout=timeout, metadata=metadata))
