"""What several Python test files share: bit patterns to compare qparams exactly, the
small model the observer tests quantize, and for the sharded tests a session's slot
and the admin token their replicas take."""

from __future__ import annotations

import pathlib
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


# Admin calls (qparams.v1.ClusterAdmin: SetSlotMap, SetSlotState, ReadSlotRecords,
# ImportSessions, DropSlots: Client.set_slot_map, qparams-cli reshard and slotmap
# push) are taken only by a server with --admin_tokens_file, with one of its tokens; a
# server without that file refuses them PERMISSION_DENIED. On a server without
# --auth_tokens_file data calls ignore the authorization header, so a client may carry
# the admin token on every call.
ADMIN_TOKEN = "qparams-test-admin-token-0123"


def admin_tokens_file(directory: pathlib.Path) -> pathlib.Path:
    """Writes DIRECTORY/admin-tokens, holding ADMIN_TOKEN (admin "tests"), and returns
    its path for a server's --admin_tokens_file; it goes with the directory."""
    path = pathlib.Path(directory) / "admin-tokens"
    path.write_text(f"{ADMIN_TOKEN} tests\n")
    return path


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
