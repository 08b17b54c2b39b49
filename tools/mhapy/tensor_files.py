"""Writers of the two tensor files mha reads, standard library only: safetensors (weights) and
.npy version 1.0 (inputs), and a safetensors reader. mhapy.golden writes its weights and
mhapy.peak_rss its weights and inputs through them; the tests read what mha_bench writes."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path


def write_safetensors(
    path: Path, tensors: dict[str, tuple[str, Sequence[int], bytes]], metadata: dict[str, str] | None = None
) -> None:
    """tensors: name -> (safetensors dtype such as "F32", shape, little-endian bytes), stored in
    that order. The header is compact JSON, __metadata__ last (when given), padded with spaces to
    a multiple of 8 bytes as the reference implementation pads it."""
    header: dict = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    if metadata:
        header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)


def read_safetensors(path: Path) -> tuple[dict[str, tuple[str, list[int], bytes]], dict[str, str]]:
    """The tensors of a safetensors file, name -> (dtype, shape, little-endian bytes), and its
    metadata. For files this project wrote (mha_bench --dump-inputs); no checks beyond the
    format's framing."""
    data = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    metadata = header.pop("__metadata__", {})
    body = data[8 + length :]
    tensors = {
        name: (entry["dtype"], entry["shape"], body[entry["data_offsets"][0] : entry["data_offsets"][1]])
        for name, entry in header.items()
    }
    return tensors, metadata


def write_npy(path: Path, shape: Sequence[int], data: bytes, descr: str = "<f4") -> None:
    """A C-order .npy file (format 1.0) of `data`, whose elements are `descr` (numpy's spelling:
    "<f4" little-endian float32)."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {tuple(shape)}, }}"
    header += " " * (63 - (10 + len(header)) % 64) + "\n"  # pad so data starts 64-aligned
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1"))
        f.write(data)
