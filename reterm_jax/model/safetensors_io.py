"""Raw safetensors reading and writing, one tensor at a time, without torch.

The format is tiny: an 8-byte little-endian header length, a JSON header
({name: {dtype, shape, data_offsets}, "__metadata__": {...}}), then the tensor bytes.
Parsing it ourselves lets us (a) read any sub-slice of a tensor from disk so a mesh
device only pulls its own rows, (b) copy passthrough tensors (vision tower, MTP)
byte for byte, and (c) write a shard header first and then stream tensors into it,
so neither loading nor saving ever holds a whole model on the host.

We read with explicit `pread`s into fresh buffers rather than an mmap: mmapped pages
stay in the process's RSS until unmapped, which would make a streamed load look (and,
under memory pressure, behave) like a whole-checkpoint load.
"""
from __future__ import annotations

import json
import math
import os
import re
import struct
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import ml_dtypes
import numpy as np

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8),
    "U16": np.dtype(np.uint16), "U32": np.dtype(np.uint32), "U64": np.dtype(np.uint64),
    "BOOL": np.dtype(np.bool_), "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
}
_CODES = {v: k for k, v in _DTYPES.items()}


def dtype_from_code(code: str) -> np.dtype:
    if code not in _DTYPES:
        raise ValueError(f"unsupported safetensors dtype {code!r} (known: {sorted(_DTYPES)})")
    return _DTYPES[code]


def code_from_dtype(dtype) -> str:
    dt = np.dtype(dtype)
    if dt not in _CODES:
        raise ValueError(f"dtype {dt} cannot be stored in safetensors")
    return _CODES[dt]


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: str          # absolute path of the .safetensors file holding it
    dtype: str         # safetensors code, e.g. "BF16"
    shape: tuple[int, ...]
    start: int         # absolute byte offset in `file`
    nbytes: int

    @property
    def np_dtype(self) -> np.dtype:
        return dtype_from_code(self.dtype)


def read_header(path: str) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Tensor infos and `__metadata__` of one .safetensors file (reads only the header)."""
    with open(path, "rb") as fh:
        raw_len = fh.read(8)
        if len(raw_len) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw_len)
        if n > 100_000_000:
            raise ValueError(f"{path}: implausible header length {n}; file is corrupt or not safetensors")
        header = json.loads(fh.read(n))
    meta = header.pop("__metadata__", None) or {}
    base = 8 + n
    infos = {}
    for name, h in header.items():
        begin, end = h["data_offsets"]
        infos[name] = TensorInfo(name, os.path.abspath(path), h["dtype"], tuple(h["shape"]),
                                 base + begin, end - begin)
    return infos, meta


class CheckpointReader:
    """All tensors of an HF checkpoint directory: `model.safetensors`, or shards + index."""

    def __init__(self, directory: str):
        self.directory = directory
        single, index = os.path.join(directory, SINGLE_FILE), os.path.join(directory, INDEX_FILE)
        if os.path.exists(index):
            with open(index) as fh:
                weight_map = json.load(fh)["weight_map"]
            files = sorted(set(weight_map.values()))
        elif os.path.exists(single):
            files = [SINGLE_FILE]
        else:
            raise FileNotFoundError(
                f"{directory}: no {SINGLE_FILE} or {INDEX_FILE}; point at an HF checkpoint "
                "directory saved with safetensors (save_pretrained(..., safe_serialization=True))")
        self.tensors: dict[str, TensorInfo] = {}
        self.metadata: dict[str, str] = {}
        for f in files:
            path = os.path.join(directory, f)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{index} lists {f}, which is missing from {directory}")
            infos, meta = read_header(path)
            self.metadata.update(meta)
            for name, info in infos.items():
                if name in self.tensors:
                    raise ValueError(f"tensor {name} appears in both {self.tensors[name].file} and {path}")
                self.tensors[name] = info

    def names(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        return self.tensors[name]

    def raw(self, name: str) -> bytes:
        info = self.tensors[name]
        return _pread(info.file, info.start, info.nbytes)

    def read(self, name: str, rows: slice | None = None) -> np.ndarray:
        """The tensor (or rows `rows` of its first axis) as a fresh numpy array.

        Rows of a C-order tensor are one contiguous byte range, so a device that owns a
        slice of the first axis reads only its part of the file.
        """
        info = self.tensors[name]
        dt = info.np_dtype
        if not info.shape:
            return np.frombuffer(self.raw(name), dtype=dt).reshape(())
        start, stop, step = (rows or slice(None)).indices(info.shape[0])
        row_bytes = math.prod(info.shape[1:]) * dt.itemsize
        n = max(stop - start, 0)
        buf = _pread(info.file, info.start + start * row_bytes, n * row_bytes)
        out = np.frombuffer(buf, dtype=dt).reshape((n,) + info.shape[1:])
        return out[::step] if step != 1 else out


def _pread(path: str, offset: int, size: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks, done = [], 0
        while done < size:  # pread may return short reads for very large sizes
            chunk = os.pread(fd, min(size - done, 1 << 30), offset + done)
            if not chunk:
                raise ValueError(f"{path}: truncated (wanted {size} bytes at offset {offset})")
            chunks.append(chunk)
            done += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- writing


@dataclass
class PendingTensor:
    """A tensor to write: header facts up front, bytes produced only when its turn comes."""
    name: str
    dtype: str                      # safetensors code
    shape: tuple[int, ...]
    produce: Callable[[], bytes | np.ndarray]

    @property
    def np_dtype(self) -> np.dtype:
        return dtype_from_code(self.dtype)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.np_dtype.itemsize


def parse_size(size: int | str) -> int:
    """'5GB' -> 5e9, '500MiB' -> 500 * 2**20, like transformers' max_shard_size."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)?\s*", str(size), re.IGNORECASE)
    if not m:
        raise ValueError(f"max_shard_size {size!r} is not a size like '5GB', '500MB' or 1000000")
    unit = (m.group(2) or "B").upper()
    scale = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}[unit]
    return int(float(m.group(1)) * scale)


def plan_shards(tensors: Sequence[PendingTensor], max_shard_size: int) -> list[list[PendingTensor]]:
    """Greedy, order-preserving split into shards of at most max_shard_size bytes
    (a single bigger tensor gets a shard of its own, as in transformers)."""
    shards: list[list[PendingTensor]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_shard_size:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return shards


def write_file(path: str | None, tensors: Iterable[PendingTensor],
               metadata: dict[str, str] | None = None) -> None:
    """Write one .safetensors file, producing each tensor's bytes only when it is written.

    Tensors are laid out by decreasing item size (as the safetensors library does) so
    every tensor starts at an offset aligned to its element size. `path=None` still
    produces every tensor (multi-host gathers are collective) but writes nothing.
    """
    ordered = sorted(tensors, key=lambda t: -t.np_dtype.itemsize)
    header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for t in ordered:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keep the data section 8-byte aligned
    fh = open(path + ".tmp", "wb") if path else None
    try:
        if fh:
            fh.write(struct.pack("<Q", len(blob)))
            fh.write(blob)
        for t in ordered:
            data = t.produce()
            if isinstance(data, np.ndarray):
                if data.dtype != t.np_dtype or data.shape != t.shape:
                    raise ValueError(f"{t.name}: produced {data.dtype}{list(data.shape)}, "
                                     f"header says {t.dtype}{list(t.shape)}")
                # A uint8 view writes through the buffer protocol without a bytes copy.
                data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            if len(data) != t.nbytes:
                raise ValueError(f"{t.name}: produced {len(data)} bytes, header says {t.nbytes}")
            if fh:
                fh.write(data)
    finally:
        if fh:
            fh.close()
    if path:
        os.replace(path + ".tmp", path)


def write_checkpoint(out_dir: str, tensors: Sequence[PendingTensor], *, max_shard_size: int | str,
                     write: bool = True) -> list[str]:
    """Write `model.safetensors`, or `model-0000i-of-0000N.safetensors` shards plus
    `model.safetensors.index.json` when more than one shard is needed (the
    transformers convention). Returns the file names written."""
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise ValueError(f"duplicate tensor names in export: {dup[:5]}")
    shards = plan_shards(tensors, parse_size(max_shard_size))
    n = len(shards)
    files = [SINGLE_FILE] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    if write:
        os.makedirs(out_dir, exist_ok=True)
    for fname, shard in zip(files, shards):
        write_file(os.path.join(out_dir, fname) if write else None, shard)
    if write and n > 1:
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)},
                 "weight_map": {t.name: f for f, shard in zip(files, shards) for t in shard}}
        with open(os.path.join(out_dir, INDEX_FILE), "w") as fh:
            json.dump(index, fh, indent=2, sort_keys=True)
            fh.write("\n")
    return files
