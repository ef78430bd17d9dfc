"""qparams: the Python client of the qparams service, which computes quantization
parameters (scale, zero point, minval) bit for bit as coreai_opt does.

    import numpy as np
    import qparams

    with qparams.Client() as client:            # $QPARAMS_TARGET, else 127.0.0.1:50051
        client.create_session("demo", target="weight", dtype="int8", qscheme="asymmetric",
                              granularity="per_channel:0", calculator="global_minmax")
        client.observe("demo", np.random.randn(4, 16).astype(np.float32))
        print(client.get_qparams("demo").scale)

PyTorch observers (torch.ao.quantization) are in qparams.torch. NVFP4 quantize /
dequantize / pack (qparams.nvfp4) and a safetensors reader and writer
(qparams.safetensors) need torch too; they are imported on first use, so that
`import qparams` needs no torch.
"""

import importlib
from typing import Any

from qparams._errors import (Aborted, AlreadyExists, Cancelled, DataLoss, DeadlineExceeded,
                             FailedPrecondition, FusedGlobalScalesDiffer, IncompleteListing,
                             Internal,
                             InvalidArgument, NotFound, UncalibratedGroup,
                             OutOfRange, PermissionDenied, QParamsError, ResourceExhausted,
                             Unauthenticated, Unavailable, Unimplemented, Unknown)
from qparams._export import is_e4m3
from qparams._histogram import Calibration, Histogram, canonical_exponent, local_histogram
from qparams._results import GroupMember, GroupQParams, ObserveResult, QParams, ScaleGroup
from qparams._spec import block_shape, granularity, quant_spec
from qparams._steps import (StepContribution, StepContributionResult, StepRead, StepReadResult,
                            StepResult)
from qparams.client import DEFAULT_TARGET, Client
from qparams.v1 import qparams_pb2 as pb

_LAZY_MODULES = ("nvfp4", "safetensors")

__version__ = "0.1.0"

__all__ = [
    "Client", "DEFAULT_TARGET", "QParams", "ObserveResult", "ScaleGroup", "GroupMember",
    "GroupQParams", "quant_spec", "granularity", "StepContribution", "StepRead",
    "StepContributionResult", "StepReadResult", "StepResult",
    "Histogram", "Calibration", "local_histogram", "canonical_exponent",
    "block_shape", "is_e4m3", "pb", "QParamsError", "Cancelled", "Unknown", "InvalidArgument",
    "DeadlineExceeded", "NotFound", "AlreadyExists", "PermissionDenied", "ResourceExhausted",
    "FailedPrecondition", "Aborted", "OutOfRange", "Unimplemented", "Internal", "Unavailable",
    "DataLoss", "Unauthenticated", "FusedGlobalScalesDiffer", "UncalibratedGroup",
    "IncompleteListing",
]  # not the lazy modules, so that `from qparams import *` needs no torch


def __getattr__(name: str) -> Any:
    """qparams.nvfp4 and qparams.safetensors, imported (with torch) when first named."""
    if name in _LAZY_MODULES:
        return importlib.import_module(f"qparams.{name}")
    raise AttributeError(f"module 'qparams' has no attribute {name!r}")
