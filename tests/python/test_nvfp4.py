"""qparams.nvfp4 beyond the conformance vectors: the e4m3 encoding against an
independent nearest-value search, nibble order, sign of zero and the typed errors.
No server needed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import qparams
from qparams import nvfp4


def e4m3_values() -> np.ndarray:
    """The 256 code values, computed here from the format's definition (§3.4)."""
    b = np.arange(256)
    e, m = (b >> 3) & 15, (b & 7).astype(np.float64)
    v = np.where(e == 0, m * 2.0 ** -9, (1 + m / 8) * 2.0 ** (e - 7.0))
    v = np.where(b >= 128, -v, v)
    return np.where((e == 15) & ((b & 7) == 7), np.nan, v)


def nearest_code(x: float) -> int:
    """The e4m3 code of x by search: the nearest of the 127 non-negative finite values,
    ties to the even code; NaN beyond 464; the sign kept."""
    a = abs(x)
    if not np.isfinite(a) or a > 464:
        return 0x7F | (0x80 if np.signbit(x) else 0)
    values = e4m3_values()[:127]
    dist = np.abs(values - a)
    best = np.flatnonzero(dist == dist.min())
    code = int(best[0]) if len(best) == 1 else int(best[best % 2 == 0][0])
    return code | (0x80 if np.signbit(x) else 0)


def test_decode_is_the_definition() -> None:
    decoded = nvfp4.e4m3_decode(torch.arange(256, dtype=torch.uint8)).numpy()
    assert np.array_equal(decoded, e4m3_values().astype(np.float32), equal_nan=True)
    assert decoded[0x7E] == 448 and decoded[0x08] == 2.0 ** -6 and decoded[0x01] == 2.0 ** -9


def test_encode_matches_a_nearest_value_search() -> None:
    values = e4m3_values()[:127]
    mids = (values[1:] + values[:-1]) / 2
    rng = np.random.default_rng(5)
    xs = np.concatenate([values, mids, np.nextafter(mids, 0), np.nextafter(mids, 1000),
                         [464.0, 464.00003, 480.0, 1e30, np.inf, np.nan, 2.0 ** -10,
                          2.0 ** -10 + 2.0 ** -30, 1e-40, 0.0],
                         rng.uniform(0, 500, 2000), 2.0 ** rng.uniform(-12, 9, 2000)])
    xs = np.concatenate([xs, -xs]).astype(np.float32)
    ours = nvfp4.e4m3_encode(torch.from_numpy(xs)).tolist()
    assert ours == [nearest_code(float(x)) for x in xs]


def test_encode_keeps_the_sign_of_zero() -> None:
    assert nvfp4.e4m3_encode(torch.tensor([0.0, -0.0, -1e-9])).tolist() == [0x00, 0x80, 0x80]


def test_pack_order_and_unpack() -> None:
    nibbles = torch.tensor([[1, 2, 3, 4], [15, 0, 8, 7]], dtype=torch.uint8)
    packed = nvfp4.pack(nibbles)
    assert packed.tolist() == [[0x21, 0x43], [0x0F, 0x78]]
    assert torch.equal(nvfp4.unpack(packed), nibbles)


def test_sign_of_zero_in_both_conventions() -> None:
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1], x[0, 2] = -0.0, -1e-6, 6.0
    codes = torch.tensor([0x38], dtype=torch.uint8)  # d = 1 with a global scale of 1
    for convention, negative_zero in (("compressed_tensors", True), ("modelopt", False)):
        packed, _ = nvfp4.quantize(x, 1.0, convention, codes)
        nibbles = nvfp4.unpack(packed)[0]
        assert nibbles[:3].tolist() == [0x0, 0x8, 0x7]
        out = nvfp4.dequantize(packed, codes, 1.0, convention)
        assert out[0, 1].item() == 0 and bool(torch.signbit(out[0, 1])) == negative_zero
        assert out[0, 2].item() == 6.0


def test_results_stay_on_the_input_device_and_keep_the_shape() -> None:
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    packed, codes = nvfp4.quantize(x, 100.0)
    assert packed.shape == (2, 3, 16) and codes.shape == (2, 3, 2)
    assert packed.device == x.device and packed.dtype == torch.uint8
    out = nvfp4.dequantize(packed, codes.ravel(), torch.tensor([100.0]))
    assert out.shape == x.shape and out.dtype == torch.float32


@pytest.mark.parametrize("call, error", [
    (lambda: nvfp4.quantize(torch.tensor([float("nan")] * 16), 1.0), nvfp4.NonFiniteInput),
    (lambda: nvfp4.quantize(torch.tensor([float("inf")] * 16), 1.0), nvfp4.NonFiniteInput),
    (lambda: nvfp4.quantize(torch.zeros(2, 20), 1.0), nvfp4.BlockShapeError),
    (lambda: nvfp4.quantize(torch.zeros(()), 1.0), nvfp4.BlockShapeError),
    (lambda: nvfp4.quantize(torch.zeros(2, 32), 1.0, "modelopt",
                            torch.zeros(3, dtype=torch.uint8)), nvfp4.BlockShapeError),
    (lambda: nvfp4.quantize(torch.zeros(2, 16), 1.0, "torchao"), nvfp4.NVFP4Error),
    (lambda: nvfp4.quantize(torch.zeros(2, 16), 0.0), nvfp4.NVFP4Error),
    (lambda: nvfp4.quantize(torch.zeros(2, 16, dtype=torch.int32), 1.0), nvfp4.NVFP4Error),
    (lambda: nvfp4.dequantize(torch.zeros(1, 4, dtype=torch.uint8),
                              torch.zeros(1, dtype=torch.uint8), 1.0), nvfp4.BlockShapeError),
])
def test_typed_errors(call, error) -> None:
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, ValueError) and not isinstance(info.value,
                                                                 qparams.QParamsError)
