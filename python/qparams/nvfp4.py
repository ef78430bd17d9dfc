"""NVFP4 quantize, dequantize and pack on the client (nvfp4.md §5), bit for bit.

The service computes the scales (a session's or group's `scale_e4m3` and
`global_scale`); this module turns a weight or activation into the checkpoint's packed
float4_e2m1 payload with them, and back. It is written in vectorized torch so that it
runs where the weights are, on the tensor's own device, without copying them to the
host. Blocks are 16 consecutive elements along the last axis.

Two conventions, as the service's spec names them:

- "compressed_tensors" (the default, also ""): dequantization scale
  `val(byte) / global_scale`, the scaled value clamped to ±6, nibble 0x8 dequantizes
  to -0.0;
- "modelopt": dequantization scale `val(byte) * global_scale` (scale_2), no clamp,
  nibble 0x8 dequantizes to +0.0; a 0x00 block byte gives nibbles 0x7 / 0xF.

torch 1.13 has no float8 dtype, so block scales are torch.uint8 tensors of
float8_e4m3fn codes; e4m3_encode and e4m3_decode convert them (§3.4).
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["NVFP4Error", "NonFiniteInput", "BlockShapeError", "BLOCK", "CONVENTIONS",
           "e4m3_encode", "e4m3_decode", "block_scales", "dequant_scales", "quantize",
           "dequantize", "pack", "unpack"]

BLOCK = 16
CONVENTIONS = ("compressed_tensors", "modelopt")

# e2m1 magnitudes, at nibble indices 0..7.
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Round to nearest even: a magnitude above a bound moves up; at the bounds between an
# odd index and the even one above it (0.75, 1.75, 3.5) the tie goes up too.
_ABOVE = (0.25, 1.25, 2.5, 5.0)
_AT_OR_ABOVE = (0.75, 1.75, 3.5)
_E4M3_MAX = 448.0
_E4M3_EPS_CODE = 0x20  # 0.125, compressed-tensors' replacement for a zero scale
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


class NVFP4Error(ValueError):
    """A tensor or argument the NVFP4 helpers refuse before computing anything (the
    client-side counterpart of INVALID_ARGUMENT)."""


class NonFiniteInput(NVFP4Error):
    """The tensor to quantize holds NaN or ±inf."""


class BlockShapeError(NVFP4Error):
    """A last dimension that is not a multiple of 16, or block scales or a packed
    tensor whose shape does not match the tensor's blocks."""


def _convention(convention: str) -> str:
    if convention == "":
        return "compressed_tensors"
    if convention not in CONVENTIONS:
        raise NVFP4Error(f"convention must be 'compressed_tensors' or 'modelopt', "
                         f"not {convention!r}")
    return convention


def _global_scale(global_scale: float | torch.Tensor, device: torch.device) -> torch.Tensor:
    """The global scale as a float32 0-dim tensor on `device` (a device tensor, so that
    divisions by it are true divisions on every device)."""
    g = torch.as_tensor(global_scale, dtype=torch.float32).reshape(()).to(device)
    if not bool(torch.isfinite(g)) or float(g) <= 0:
        raise NVFP4Error(f"global_scale must be finite and positive, not {float(g)!r}")
    return g


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """x viewed as [..., n/16, 16]; refuses non-float, non-finite or badly shaped x."""
    if not isinstance(x, torch.Tensor) or x.dtype not in _FLOATS:
        raise NVFP4Error("quantize takes a float32, bfloat16 or float16 torch tensor, not "
                         f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.shape[-1] % BLOCK:
        raise BlockShapeError(f"the last dimension of shape {list(x.shape)} is not a "
                              f"multiple of {BLOCK}")
    if not bool(torch.isfinite(x).all()):
        raise NonFiniteInput("the tensor to quantize holds NaN or infinity")
    return x.reshape(*x.shape[:-1], x.shape[-1] // BLOCK, BLOCK)


def _scale_codes(scale_e4m3: torch.Tensor | np.ndarray, blocks_shape: tuple[int, ...],
                 device: torch.device) -> torch.Tensor:
    """Block scale codes as uint8 [..., n/16] on `device` (any shape with that many
    elements, e.g. flat as the service returns them)."""
    codes = torch.as_tensor(scale_e4m3).to(device)
    if codes.dtype != torch.uint8:
        raise NVFP4Error(f"scale_e4m3 must be uint8 float8_e4m3fn codes, not {codes.dtype}")
    if codes.numel() != _prod(blocks_shape):
        raise BlockShapeError(f"{codes.numel()} block scales for {_prod(blocks_shape)} "
                              f"blocks of {BLOCK}")
    return codes.reshape(blocks_shape)


def _prod(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def e4m3_encode(x: torch.Tensor) -> torch.Tensor:
    """The float8_e4m3fn codes (uint8) of a float tensor's values, as torch's CPU
    `.to(torch.float8_e4m3fn)` rounds them (nvfp4.md §3.4): to nearest, ties to the
    even code; |x| > 464, NaN and ±inf give NaN (0x7F, or 0xFF when negative); the sign
    of zero is kept."""
    f = x.to(torch.float32).contiguous().view(torch.int32)
    sign = (f >> 24) & 0x80  # arithmetic shift: bit 31 lands on bit 7
    mag = f & 0x7FFFFFFF
    # Subnormal codes: adding 2^14 rounds |x| to a multiple of 2^-9 (RNE) in float32.
    sub = (x.to(torch.float32).abs() + 16384.0).view(torch.int32) - 0x46800000
    normal = ((mag - (120 << 23) + 0x7FFFF + ((mag >> 20) & 1)) >> 20) & 0xFF
    code = torch.where(mag < 0x3C800000, sub, normal)
    code = torch.where(mag >= 0x43F00000, torch.full_like(code, 0x7F), code)
    return (code | sign).to(torch.uint8)


def _e4m3_table(device: torch.device) -> torch.Tensor:
    """The float32 value of every e4m3 code, indexed by code."""
    b = torch.arange(256, dtype=torch.int32, device=device)
    s = torch.where(b >= 128, -1.0, 1.0).to(torch.float32)
    e = (b >> 3) & 15
    m = (b & 7).to(torch.float32)
    sub = m * 2.0 ** -9
    normal = (1.0 + m / 8.0) * torch.pow(2.0, (e - 7).to(torch.float32))
    value = s * torch.where(e == 0, sub, normal)
    return torch.where((e == 15) & ((b & 7) == 7), torch.tensor(float("nan"), device=device),
                       value)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """The float32 values of float8_e4m3fn codes (a uint8 tensor), exact; 0x7F and
    0xFF are NaN (nvfp4.md §3.4)."""
    codes = torch.as_tensor(codes)
    if codes.dtype != torch.uint8:
        raise NVFP4Error(f"float8_e4m3fn codes must be uint8, not {codes.dtype}")
    return _e4m3_table(codes.device)[codes.long()]


def block_scales(x: torch.Tensor, global_scale: float | torch.Tensor,
                 convention: str = "compressed_tensors") -> torch.Tensor:
    """Dynamic block scales: each 16-element block's float8_e4m3fn code (uint8, shape
    [..., n/16]) computed from the block itself with a global scale fixed beforehand
    (nvfp4.md §5, "Dynamic activations"). compressed_tensors runs the §3.2 steps in
    x's dtype; modelopt the §3.3 steps with min(s, 448).

    Raises:
        NonFiniteInput, BlockShapeError, NVFP4Error: see quantize.
    """
    convention = _convention(convention)
    return _block_codes(_blocks(x), _global_scale(global_scale, x.device), convention)


def _block_codes(blocks: torch.Tensor, g: torch.Tensor, convention: str) -> torch.Tensor:
    amax = blocks.abs().amax(dim=-1)  # in the input's dtype: exact
    if convention == "compressed_tensors":
        # fl_P(amax / 6), a true division in float32 rounded to P, then float32 gs * t.
        six = torch.tensor(6.0, device=blocks.device)
        t = (amax.to(torch.float32) / six).to(blocks.dtype)
        s = (g * t.to(torch.float32)).clamp(-_E4M3_MAX, _E4M3_MAX)
        codes = e4m3_encode(s)
        return torch.where(e4m3_decode(codes) == 0, torch.full_like(codes, _E4M3_EPS_CODE),
                           codes)
    den = g * 6.0  # f32(6 * scale_2), one float32 rounding
    s = amax.to(torch.float32) / den
    s = torch.where(s == 0, torch.ones_like(s), s).clamp(max=_E4M3_MAX)
    return e4m3_encode(s)


def dequant_scales(scale_e4m3: torch.Tensor, global_scale: float | torch.Tensor,
                   convention: str = "compressed_tensors") -> torch.Tensor:
    """Each block's float32 dequantization scale d: f32(val(byte) / global_scale)
    (compressed_tensors) or f32(val(byte) * global_scale) (modelopt), shaped as
    scale_e4m3."""
    convention = _convention(convention)
    values = e4m3_decode(scale_e4m3)
    g = _global_scale(global_scale, values.device)
    return values / g if convention == "compressed_tensors" else values * g


def quantize(x: torch.Tensor, global_scale: float | torch.Tensor,
             convention: str = "compressed_tensors",
             scale_e4m3: torch.Tensor | np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantizes x to packed NVFP4 (nvfp4.md §5) on x's device.

    Args:
        x: float32, bfloat16 or float16 tensor whose last dimension is a multiple of 16.
        global_scale: the float32 global scale (gs, or modelopt's scale_2), as a float
            or a one-element tensor.
        convention: "compressed_tensors" (or "") or "modelopt".
        scale_e4m3: static mode: the block scales' float8_e4m3fn codes (a uint8 tensor
            or numpy array with one code per block in any shape, e.g. a session's
            QParams.scale_e4m3). None: dynamic mode, computed from x (block_scales).

    Returns:
        (packed, scale_e4m3): packed uint8 of shape [..., n/2] (element 2i in the low
        nibble, 2i+1 in the high), and the block codes, uint8 [..., n/16].

    Raises:
        NonFiniteInput: x holds NaN or ±inf.
        BlockShapeError: x's last dimension is not a multiple of 16, or scale_e4m3 has
            not one code per block.
        NVFP4Error: another argument is wrong (dtype, convention, global scale).
    """
    convention = _convention(convention)
    blocks = _blocks(x)
    g = _global_scale(global_scale, x.device)
    if scale_e4m3 is None:
        codes = _block_codes(blocks, g, convention)
    else:
        codes = _scale_codes(scale_e4m3, tuple(blocks.shape[:-1]), x.device)
    d = dequant_scales(codes, g, convention).unsqueeze(-1)
    y = blocks.to(torch.float32) / d
    if convention == "compressed_tensors":
        y = y.clamp(-6.0, 6.0)
    a = y.abs()
    index = torch.zeros(a.shape, dtype=torch.uint8, device=a.device)
    for bound in _ABOVE:
        index += (a > bound).to(torch.uint8)
    for bound in _AT_OR_ABOVE:
        index += (a >= bound).to(torch.uint8)
    # NaN (0/0 under a modelopt 0x00 byte) sorts last in ModelOpt's searchsorted.
    index = torch.where(torch.isnan(a), torch.full_like(index, 7), index)
    nibbles = index | ((y < 0).to(torch.uint8) << 3)
    return pack(nibbles.reshape(x.shape)), codes


def pack(nibbles: torch.Tensor) -> torch.Tensor:
    """Packs uint8 nibbles (0..15, last dimension even) two per byte along the last
    axis: element 2i in the low nibble, 2i+1 in the high nibble."""
    if nibbles.dim() == 0 or nibbles.shape[-1] % 2:
        raise BlockShapeError(f"cannot pack a last dimension of shape {list(nibbles.shape)}")
    pairs = nibbles.to(torch.uint8).reshape(*nibbles.shape[:-1], nibbles.shape[-1] // 2, 2)
    return (pairs[..., 0] & 0xF) | ((pairs[..., 1] & 0xF) << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """The nibbles (uint8 [..., 2m]) of a packed uint8 tensor [..., m]; pack's inverse."""
    if packed.dtype != torch.uint8 or packed.dim() == 0:
        raise NVFP4Error(f"packed NVFP4 must be a uint8 tensor with at least one "
                         f"dimension, not {packed.dtype} of shape {list(packed.shape)}")
    pairs = torch.stack((packed & 0xF, packed >> 4), dim=-1)
    return pairs.reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize(packed: torch.Tensor, scale_e4m3: torch.Tensor | np.ndarray,
               global_scale: float | torch.Tensor,
               convention: str = "compressed_tensors") -> torch.Tensor:
    """The float32 values of packed NVFP4 (nvfp4.md §5), on packed's device:
    f32(v * d) for each e2m1 value v and its block's dequantization scale d. Nibble 0x8
    is -0.0 under compressed_tensors and +0.0 under modelopt.

    Args:
        packed: uint8 [..., n/2], as quantize returns it (n a multiple of 16).
        scale_e4m3: the block codes (uint8 tensor or numpy array), one per 16
            elements.
        global_scale, convention: as for quantize.

    Raises:
        BlockShapeError: n is not a multiple of 16, or scale_e4m3 has not one code per
            block.
        NVFP4Error: another argument is wrong.
    """
    convention = _convention(convention)
    nibbles = unpack(packed)
    if nibbles.shape[-1] % BLOCK:
        raise BlockShapeError(f"packed shape {list(packed.shape)} holds a last dimension "
                              f"of {nibbles.shape[-1]}, not a multiple of {BLOCK}")
    blocks_shape = (*nibbles.shape[:-1], nibbles.shape[-1] // BLOCK)
    codes = _scale_codes(scale_e4m3, blocks_shape, packed.device)
    d = dequant_scales(codes, global_scale, convention).unsqueeze(-1)
    zero = -0.0 if convention == "compressed_tensors" else 0.0
    magnitudes = list(_E2M1)
    table = torch.tensor(magnitudes + [zero] + [-v for v in magnitudes[1:]],
                         dtype=torch.float32, device=packed.device)
    v = table[nibbles.long()].reshape(*blocks_shape, BLOCK)
    return (v * d).reshape(nibbles.shape)
