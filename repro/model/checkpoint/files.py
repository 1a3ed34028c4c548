"""Reading a checkpoint's files: the shard list (single file or index), safetensors headers
checked against the file sizes, and tensor reads (whole, or row/column ranges for a TP shard).

Kept apart from the layout and the checks so that every byte read goes through `_Reader`, which
counts it (`ReadStats`): the tests prove lazy loading from those counts.
"""
from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from safetensors import safe_open

from ...errors import CheckpointError

PREFIX_MULTIMODAL = "model.language_model."
PREFIX_TEXT = "model."
IGNORED_PREFIXES = ("model.visual.", "mtp.")
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I8": torch.int8, "U8": torch.uint8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
           "BOOL": torch.bool}
_ITEMSIZE = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8, "I8": 1, "U8": 1, "I16": 2, "U16": 2, "I32": 4,
             "U32": 4, "I64": 8, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
_FLOATS = ("BF16", "F16", "F32")
_MAX_HEADER = 512 * 1024 * 1024

Ranges = Sequence[tuple[int, int]]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the safetensors header describes it (no data)."""

    name: str
    file: Path
    dtype: str  # safetensors code: BF16, I8, F32, ...
    shape: tuple[int, ...]
    nbytes: int


@dataclass
class ReadStats:
    """Tensor data actually read (headers excluded): lets a test prove lazy loading."""

    tensors_read: int = 0
    bytes_read: int = 0
    names_read: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # suspicious but loadable (e.g. zero scales)

    def reset(self) -> None:
        self.tensors_read, self.bytes_read, self.names_read, self.flags = 0, 0, [], []


def shard_files(path: Path) -> tuple[dict[str, str] | None, list[Path]]:
    """The index's weight_map (None for a single file) and the safetensors files to read; every
    shard the index lists must exist."""
    index = None
    index_path, single = path / INDEX_FILE, path / SINGLE_FILE
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text())["weight_map"]
            if not isinstance(index, dict):
                raise TypeError("weight_map is not an object")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index_path}: cannot parse weight_map ({e})") from e
        files: dict[str, str] = {}
        for name, f in index.items():
            files.setdefault(f, name)
        for f, example in files.items():
            if not (path / f).is_file():
                raise CheckpointError(
                    f"{path / f}: shard listed in {INDEX_FILE} (e.g. for tensor {example}) is missing")
        shard_paths = [path / f for f in files]
    elif single.is_file():
        shard_paths = [single]
    else:
        raise CheckpointError(f"{path}: neither {SINGLE_FILE} nor {INDEX_FILE} found")
    return index, shard_paths


def check_index(path: Path, index: dict[str, str], infos: dict[str, TensorInfo],
                ignored: dict[str, TensorInfo]) -> None:
    """The index must say where each tensor really is."""
    index_path = path / INDEX_FILE
    for name, f in index.items():
        info = infos.get(name) or ignored.get(name)
        if info is not None and info.file.name != f:
            raise CheckpointError(f"{index_path}: maps tensor {name} to {f}, but it is in {info.file.name}")


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Parse a safetensors header and check that the file is complete; no tensor data is read."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: not a safetensors file ({size} bytes; truncated or empty)")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > _MAX_HEADER:
                raise CheckpointError(f"{path}: header length {n} exceeds the file size {size} (truncated or corrupt)")
            raw = fh.read(n)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read ({e})") from e
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: corrupt safetensors header ({e})") from e
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header (not a JSON object)")
    out: dict[str, TensorInfo] = {}
    end = 0
    for name, d in meta.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = d["dtype"], tuple(int(s) for s in d["shape"]), d["data_offsets"]
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"{path}: corrupt header entry for tensor {name} ({e!r})") from e
        item = _ITEMSIZE.get(dtype)
        if item is not None and hi - lo != math.prod(shape) * item:
            raise CheckpointError(f"{path}: tensor {name} has {hi - lo} bytes for {dtype} {list(shape)} (corrupt)")
        end = max(end, hi)
        out[name] = TensorInfo(name, path, dtype, shape, hi - lo)
    data = size - 8 - n
    if end > data:
        raise CheckpointError(
            f"{path}: truncated: the header describes {end} data bytes but the file holds {data}")
    if end < data:
        raise CheckpointError(f"{path}: corrupt: {data - end} bytes after the last tensor")
    return out


def _one_range_slices(ndim: int, dim: int, lo: int, hi: int) -> tuple[slice, ...]:
    return tuple(slice(None) for _ in range(dim)) + (slice(lo, hi),) + tuple(slice(None) for _ in range(ndim - dim - 1))


class _Reader:
    """Open shards on demand for one load and read tensors (whole, or row/column ranges)."""

    def __init__(self, ckpt):  # a `Checkpoint`: its `info` names the file, its `stats` count the reads
        self.ckpt = ckpt
        self.stack = ExitStack()
        self.handles: dict[Path, object] = {}

    def __enter__(self) -> "_Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    def _handle(self, file: Path):
        if file not in self.handles:
            try:
                self.handles[file] = self.stack.enter_context(safe_open(str(file), framework="pt"))
            except Exception as e:  # safetensors raises its own SafetensorError
                raise CheckpointError(f"{file}: cannot open as safetensors ({e})") from e
        return self.handles[file]

    def read(self, name: str, dim: int | None = None, ranges: Ranges | None = None) -> torch.Tensor:
        info = self.ckpt.info(name)
        fh = self._handle(info.file)
        try:
            if ranges is None:
                t = fh.get_tensor(name)
            else:
                sl = fh.get_slice(name)
                parts = [sl[_one_range_slices(len(info.shape), dim, lo, hi)] for lo, hi in ranges]
                t = parts[0] if len(parts) == 1 else torch.cat(parts, dim)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{info.file}: cannot read tensor {name} ({e})") from e
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{info.file}: tensor {name} holds NaN or infinite values")
        st = self.ckpt.stats
        if name.endswith(".weight_scale") and t.numel():
            # A negative per-channel scale has no meaning in Quark's symmetric int8; a zero one
            # zeroes its output channel (possible only for an all-zero weight row): flagged.
            if bool((t < 0).any()):
                raise CheckpointError(f"{info.file}: tensor {name} has negative scales (symmetric int8 needs > 0)")
            zeros = int((t == 0).sum())
            if zeros:
                st.flags.append(f"{name}: {zeros} zero scale(s): those output channels are always 0")
        st.tensors_read += 1
        st.bytes_read += t.numel() * t.element_size()
        st.names_read.append(name)
        return t


def _row_runs(rows, n: int, what: str) -> tuple[list[tuple[int, int]], torch.Tensor | None]:
    """Rows to read as contiguous runs, and the index that puts them in the requested order."""
    if isinstance(rows, slice):
        rows = range(n)[rows]
    if isinstance(rows, range) and rows.step == 1:
        if len(rows) and not (0 <= rows.start and rows.stop <= n):
            raise CheckpointError(f"rows {rows.start}..{rows.stop - 1} out of range for {what} with {n} rows")
        return [(rows.start, rows.stop)], None
    want = [int(r) for r in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]
    if not want:
        raise CheckpointError(f"no rows asked for from {what}")
    bad = [r for r in want if not 0 <= r < n]
    if bad:
        raise CheckpointError(f"row {bad[0]} out of range for {what} with {n} rows")
    uniq = sorted(set(want))
    runs: list[tuple[int, int]] = []
    for r in uniq:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    pos = {r: i for i, r in enumerate(uniq)}
    return runs, torch.tensor([pos[r] for r in want], dtype=torch.long)
