"""What several Python test files share: bit patterns to compare qparams exactly, the
small model the observer tests quantize, and a session's slot for the sharded tests."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from torch.ao.quantization import DeQuantStub, QuantStub


def f32_bits(x: Any) -> list[int] | None:
    """The float32 bit patterns of a tensor, array, list or float (whose values are
    float32), flattened, so that -0.0 and every ulp count; None for None."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, np.float64).astype(np.float32).view(np.uint32).ravel().tolist()


def slot(name: str) -> int:
    """The slot of a session name without hash tags, crc32(name) mod 256, computed here
    apart from the client's and the server's routing, which the tests check."""
    return zlib.crc32(name.encode()) % 256


class Net(nn.Module):
    """QuantStub -> Linear(16, 8) -> ReLU -> Linear(8, 4) -> DeQuantStub."""

    def __init__(self) -> None:
        super().__init__()
        self.quant = QuantStub()
        self.fc1 = nn.Linear(16, 8)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(8, 4)
        self.dequant = DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))
