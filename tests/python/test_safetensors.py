"""qparams.safetensors: round trips of every dtype, the documented byte layout and
alignment, F8_E4M3 codes, and the errors on malformed files. No server needed."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

import qparams
from qparams import nvfp4
from qparams.safetensors import DTYPES, SafetensorsError, load, save


def raw_file(path: Path, header: dict | bytes, data: bytes = b"",
             length: int | None = None) -> Path:
    """Writes a safetensors file by hand: the length (default: the header's), the
    header (a dict is dumped as JSON) and the data."""
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + data)
    return path


def bits(t: torch.Tensor) -> list:
    """The tensor's elements as integers of their bit patterns (bools as bools), so that
    -0.0 and NaN payloads count."""
    views = {torch.float64: torch.int64, torch.float32: torch.int32,
             torch.float16: torch.int16, torch.bfloat16: torch.int16}
    return (t.view(views[t.dtype]) if t.dtype in views else t).ravel().tolist()


def sample(dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(3, 5, generator=g) > 0.5
    if dtype.is_floating_point:
        t = (torch.randn(3, 5, generator=g) * 100).to(dtype)
        t[0, :3] = torch.tensor([-0.0, float("inf"), float("nan")])
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(info.min, info.max, (3, 5), generator=g, dtype=torch.int64).to(dtype)
    t[0, :2] = torch.tensor([info.min, info.max])
    return t


TORCH_DTYPES = sorted({d for d, _ in DTYPES.values()}, key=str)


def test_every_dtype_round_trips(tmp_path) -> None:
    tensors = {f"t.{str(d)[6:]}": sample(d) for d in TORCH_DTYPES}
    tensors["scalar"] = torch.tensor(2.5, dtype=torch.float64)
    tensors["empty"] = torch.zeros(0, 4, dtype=torch.int32)
    tensors["strided"] = torch.arange(12, dtype=torch.int16).reshape(3, 4).t()
    save(tensors, tmp_path / "a.safetensors", metadata={"format": "pt", "run": "r1"})
    loaded, metadata = load(tmp_path / "a.safetensors")
    assert metadata == {"format": "pt", "run": "r1"}
    assert sorted(loaded) == sorted(tensors)
    for name, t in tensors.items():
        assert loaded[name].dtype == t.dtype and loaded[name].shape == t.shape, name
        assert bits(loaded[name]) == bits(t.contiguous()), name
        assert not qparams.is_e4m3(loaded[name])


def test_layout_is_the_documented_one(tmp_path) -> None:
    path = tmp_path / "b.safetensors"
    save({"w": torch.tensor([1.0, -2.0]), "b": torch.tensor([3], dtype=torch.int8)}, path,
         metadata={"k": "v"})
    buf = path.read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    assert (8 + n) % 8 == 0
    header = buf[8:8 + n]
    assert header.startswith(b"{") and header == header.rstrip(b" ") + b" " * (
        len(header) - len(header.rstrip(b" ")))
    assert json.loads(header) == {
        "__metadata__": {"k": "v"},
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "I8", "shape": [1], "data_offsets": [8, 9]}}
    assert buf[8 + n:] == struct.pack("<ff", 1.0, -2.0) + b"\x03"


@pytest.mark.parametrize("name_length", range(1, 10))
def test_data_start_and_every_tensor_are_aligned(tmp_path, name_length) -> None:
    path = tmp_path / "c.safetensors"
    save({"a" * name_length: torch.ones(3, dtype=torch.uint8),
          "b": torch.ones(1, dtype=torch.float16), "c": torch.ones(1, dtype=torch.float64),
          "d": torch.ones(1, dtype=torch.int32)}, path)
    buf = path.read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    assert (8 + n) % 8 == 0
    for entry in json.loads(buf[8:8 + n]).values():
        size = {"U8": 1, "F16": 2, "F64": 8, "I32": 4}[entry["dtype"]]
        assert entry["data_offsets"][0] % size == 0


def test_f8_e4m3_codes(tmp_path) -> None:
    codes = torch.tensor([[0x00, 0x20, 0x38, 0x7E], [0x80, 0x7F, 0x01, 0xFE]],
                         dtype=torch.uint8)
    path = tmp_path / "d.safetensors"
    save({"s": codes, "u": codes.clone()}, path, e4m3=["s"])
    buf = path.read_bytes()
    (n,) = struct.unpack("<Q", buf[:8])
    header = json.loads(buf[8:8 + n])
    assert header["s"]["dtype"] == "F8_E4M3" and header["u"]["dtype"] == "U8"
    begin, end = header["s"]["data_offsets"]
    assert buf[8 + n + begin:8 + n + end] == bytes(codes.ravel().tolist())
    loaded, _ = load(path)
    assert qparams.is_e4m3(loaded["s"]) and not qparams.is_e4m3(loaded["u"])
    assert loaded["s"].dtype == torch.uint8 and torch.equal(loaded["s"], codes)
    # A loaded (tagged) tensor is written back as F8_E4M3 without being named.
    save(loaded, tmp_path / "e.safetensors")
    again, _ = load(tmp_path / "e.safetensors")
    assert qparams.is_e4m3(again["s"]) and not qparams.is_e4m3(again["u"])


def test_nvfp4_checkpoint_round_trip(tmp_path) -> None:
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    gs = 2688.0 / w.abs().max().item()
    packed, codes = nvfp4.quantize(w, gs)
    save({"fc.weight_packed": packed, "fc.weight_scale": codes,
          "fc.weight_global_scale": torch.tensor([gs])}, tmp_path / "m.safetensors",
         e4m3=["fc.weight_scale"])
    t, metadata = load(tmp_path / "m.safetensors")
    assert metadata == {}
    assert torch.equal(nvfp4.dequantize(t["fc.weight_packed"], t["fc.weight_scale"],
                                        t["fc.weight_global_scale"]),
                       nvfp4.dequantize(packed, codes, gs))


def test_reads_unpadded_headers_in_any_order(tmp_path) -> None:
    header = {"b": {"dtype": "I16", "shape": [1], "data_offsets": [4, 6]},
              "a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}
    path = raw_file(tmp_path / "f.safetensors", header,
                    struct.pack("<f", 0.5) + struct.pack("<h", -3))
    tensors, metadata = load(path)
    assert list(tensors) == ["b", "a"] and metadata == {}
    assert tensors["a"].shape == () and tensors["a"].item() == 0.5
    assert tensors["b"].tolist() == [-3]


F32x2 = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


@pytest.mark.parametrize("header, data, length, match", [
    (b"", b"", None, "too short"),
    (b"{}", b"", 100, "exceeds"),
    (b"{\"a\": ", b"", None, "not UTF-8 JSON"),
    (b"[1, 2]", b"", None, "does not start"),
    (b"{\"a\": 1, \"a\": 2}", b"", None, "more than once"),
    ({"__metadata__": {"k": 1}}, b"", None, "__metadata__"),
    ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8), None, "lacks"),
    ({"a": {**F32x2, "dtype": "U16"}}, bytes(8), None, "does not know"),
    ({"a": {**F32x2, "shape": [-2]}}, bytes(8), None, "shape"),
    ({"a": {**F32x2, "data_offsets": [8, 0]}}, bytes(8), None, "data_offsets"),
    ({"a": {**F32x2, "shape": [3]}}, bytes(8), None, "needs 12 bytes"),
    ({"a": F32x2, "b": {**F32x2, "data_offsets": [4, 12]}}, bytes(12), None, "overlaps"),
    ({"a": F32x2, "b": {**F32x2, "data_offsets": [12, 20]}}, bytes(20), None, "hole"),
    ({"a": F32x2}, bytes(12), None, "hold 8 bytes, the file 12"),
    ({"a": F32x2}, bytes(4), None, "hold 8 bytes, the file 4"),
])
def test_malformed_files_are_refused(tmp_path, header, data, length, match) -> None:
    path = tmp_path / "bad.safetensors"
    if header == b"":
        path.write_bytes(b"\x01\x02\x03")
    else:
        raw_file(path, header, data, length)
    with pytest.raises(SafetensorsError, match=match):
        load(path)


def test_save_refuses_what_it_cannot_write(tmp_path) -> None:
    path = tmp_path / "g.safetensors"
    with pytest.raises(SafetensorsError, match="dtype"):
        save({"c": torch.zeros(2, dtype=torch.complex64)}, path)
    with pytest.raises(SafetensorsError, match="named"):
        save({"__metadata__": torch.zeros(2)}, path)
    with pytest.raises(SafetensorsError, match="not a torch tensor"):
        save({"a": [1.0]}, path)  # type: ignore[dict-item]
    with pytest.raises(SafetensorsError, match="strings"):
        save({"a": torch.zeros(2)}, path, metadata={"k": 1})  # type: ignore[dict-item]
    with pytest.raises(SafetensorsError, match="uint8"):
        save({"a": torch.zeros(2)}, path, e4m3=["a"])
    assert not path.exists()
