"""The exports of qparams.Client: the sessions under a prefix rendered by the server
in a deployment format (docs/exports.md), from every replica when sharded, and the
decoded scale tensors of compressed-tensors and ModelOpt exports."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import grpc

from qparams._client_core import ClientCore, Metadata
from qparams._errors import Aborted, error_from_rpc
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
        server's, put together by the deployment (docs/sharding.md); while a slot
        move switches it is refused Aborted before any byte, and made again within
        the client's retry_total, then raises Aborted.
        """
        for what, value in (("prefix", prefix), ("format", format)):
            if not isinstance(value, str):
                raise TypeError(f"{what} must be a str, not {type(value).__name__}")
        request = pb.ExportSessionsRequest(prefix=prefix, format=format,
                                           allow_uninitialized=bool(allow_uninitialized),
                                           tensor_names=dict(tensor_names or {}))
        # An export the deployment refused Aborted (a slot move was switching) was
        # refused before any byte: again, while retry_total allows.
        wait = self._retry.waits()
        while True:
            call = self._stub.ExportSessions(request, timeout=timeout or self.timeout,
                                             metadata=self._addressed(None, metadata))
            try:
                data = b"".join(chunk.data for chunk in call)
            except grpc.RpcError as e:
                error = refine_export_error(error_from_rpc(e))
                if not isinstance(error, Aborted) or not wait():
                    raise error from None
                continue
            finally:
                call.cancel()
            return data.decode("utf-8")

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
