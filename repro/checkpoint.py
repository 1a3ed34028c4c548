"""Lazy, validating loader of real-layout checkpoints (Quark W8A8 INT8 or BF16), one layer at a time.

A checkpoint is a directory with `config.json` and `model.safetensors` or a sharded
`model.safetensors.index.json`. Headers are parsed at `open` (no tensor data); `load_layer`
reads only that layer's tensors (TP shards through `get_slice`, so only the shard's bytes) and
returns the canonical `repro.weights` structures.

Accepted layouts (all converted to the canonical one):
- GDN: `linear_attn.in_proj_qkv|in_proj_z|in_proj_b|in_proj_a` (Qwen3.5/3.6) or the fused
  Qwen3-Next `in_proj_qkvz` / `in_proj_ba`, whose rows are grouped per key head g:
  `[q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv)]` and `[b_g (r) | a_g (r)]`, r = Hv/Hk
  (transformers `Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`);
- experts: per expert `mlp.experts.{e}.gate_proj|up_proj|down_proj` (`.weight`, `.weight_scale`,
  `.weight_zero_point`), or fused `mlp.experts.gate_up_proj [E, 2I, H]` / `mlp.experts.down_proj
  [E, H, I]` (no `.weight` suffix, as transformers names the parameters) with int8 siblings
  `mlp.experts.gate_up_proj_scale [E, 2I]`, `mlp.experts.down_proj_scale [E, H]` and optional
  `..._zero_point` of the scale's shape;
- a quantised linear: int8 weight, 1-D `[N]` or `[N, 1]` bf16/fp16/fp32 scale (returned fp32
  1-D), optional int8 zero point that must be all zero.

Norms, conv1d, `A_log` and `dt_bias` may be bf16, fp16 or fp32 and are returned as stored;
linear weights, the router, `shared_expert_gate` and the embedding must be bf16 (or int8 where
quantised). Every error is a `CheckpointError` naming the file and the tensor.
"""
from __future__ import annotations

import json
import math
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import torch
from safetensors import safe_open

from .config import GDN, ConfigError, ModelConfig
from .errors import CheckpointError
from .quant import BF16, W8A8_INT8, QuantScheme
from .weights import Experts, GDNWeights, HeadWeights, LayerWeights, Linear, MoEWeights

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


# --------------------------------------------------------------------------- small records


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

    def reset(self) -> None:
        self.tensors_read, self.bytes_read, self.names_read = 0, 0, []


@dataclass(frozen=True)
class QTensor:
    """A linear weight that may be quantised: its module name (for the scheme) and tensor names."""

    module: str
    weight: str
    scale: str
    zero_point: str
    shape: tuple[int, ...]  # expected weight shape, [N, K] or stacked [E, N, K]

    @classmethod
    def linear(cls, module: str, shape: tuple[int, ...]) -> "QTensor":
        return cls(module, f"{module}.weight", f"{module}.weight_scale", f"{module}.weight_zero_point", shape)

    @classmethod
    def fused(cls, name: str, shape: tuple[int, ...]) -> "QTensor":
        """A fused expert stack: the tensor is named like the module, scale is `{name}_scale`."""
        return cls(name, name, f"{name}_scale", f"{name}_zero_point", shape)

    def names(self) -> tuple[str, str, str]:
        return self.weight, self.scale, self.zero_point


@dataclass(frozen=True)
class Param:
    """A plain tensor: `strict` means bf16 only, else bf16/fp16/fp32."""

    name: str
    shape: tuple[int, ...]
    strict: bool = False


Spec = QTensor | Param


# --------------------------------------------------------------------------- layout helpers


def deinterleave_qkvz(t: torch.Tensor, groups: int, dk: int, dv: int, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused Qwen3-Next `in_proj_qkvz` rows (per key-head group [q|k|v|z]) -> (qkv [q|k|v], z).

    Works on a weight [R, H] or a scale [R]; `groups` is the number of key heads present.
    """
    rest = tuple(t.shape[1:])
    g = t.reshape(groups, 2 * dk + 2 * ratio * dv, *rest)
    q, k, v, z = torch.split(g, [dk, dk, ratio * dv, ratio * dv], dim=1)
    flat = [x.reshape(-1, *rest) for x in (q, k, v, z)]
    return torch.cat(flat[:3]), flat[3]


def interleave_qkvz(qkv: torch.Tensor, z: torch.Tensor, groups: int, dk: int, dv: int, ratio: int) -> torch.Tensor:
    """Inverse of `deinterleave_qkvz`: canonical [q|k|v] and z -> fused per-group rows."""
    rest = tuple(qkv.shape[1:])
    q, k, v = torch.split(qkv, [groups * dk, groups * dk, groups * ratio * dv])
    parts = [q.reshape(groups, dk, *rest), k.reshape(groups, dk, *rest),
             v.reshape(groups, ratio * dv, *rest), z.reshape(groups, ratio * dv, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def deinterleave_ba(t: torch.Tensor, groups: int, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused `in_proj_ba` rows (per key-head group [b (r) | a (r)]) -> (b, a), each [groups*r, ...]."""
    rest = tuple(t.shape[1:])
    b, a = torch.split(t.reshape(groups, 2 * ratio, *rest), [ratio, ratio], dim=1)
    return b.reshape(-1, *rest), a.reshape(-1, *rest)


def interleave_ba(b: torch.Tensor, a: torch.Tensor, groups: int, ratio: int) -> torch.Tensor:
    rest = tuple(b.shape[1:])
    return torch.cat([b.reshape(groups, ratio, *rest), a.reshape(groups, ratio, *rest)], dim=1).reshape(-1, *rest)


def _read_header(path: Path) -> dict[str, TensorInfo]:
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

    def __init__(self, ckpt: "Checkpoint"):
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


# --------------------------------------------------------------------------- the checkpoint


class Checkpoint:
    """A checkpoint directory, opened lazily. Use `Checkpoint.open(path)`."""

    def __init__(self, path: Path, config: ModelConfig, quant: QuantScheme, infos: dict[str, TensorInfo],
                 ignored: dict[str, TensorInfo], index: dict[str, str] | None, prefix: str):
        self.path = path
        self.config = config
        self.quant = quant
        self.prefix = prefix
        self.stats = ReadStats()
        self._infos = infos
        self._ignored = ignored
        self._index = index  # weight_map of a sharded checkpoint, else None

    # -- opening

    @classmethod
    def open(cls, path: str | Path) -> "Checkpoint":
        """Parse config and headers; any file-system error (a directory without read permission)
        becomes a one-line CheckpointError naming the path."""
        try:
            return cls._open(Path(path))
        except OSError as e:
            raise CheckpointError(f"{e.filename or path}: cannot read ({e.strerror or e})") from e

    @classmethod
    def _open(cls, path: Path) -> "Checkpoint":
        if not path.exists():
            raise CheckpointError(f"{path}: checkpoint directory does not exist")
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a directory (a checkpoint is a directory with config.json)")
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"{cfg_path}: missing (a checkpoint needs config.json)")
        try:
            raw = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{cfg_path}: cannot parse ({e})") from e
        if not isinstance(raw, dict):
            raise CheckpointError(f"{cfg_path}: expected a JSON object")
        try:
            config = ModelConfig.from_hf(raw)
        except ConfigError as e:
            raise CheckpointError(f"{cfg_path}: {e}") from e
        qc = raw.get("quantization_config")
        if qc is None and isinstance(raw.get("text_config"), dict):
            qc = raw["text_config"].get("quantization_config")
        quant = QuantScheme.from_config(qc, source=str(cfg_path))

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

        infos: dict[str, TensorInfo] = {}
        ignored: dict[str, TensorInfo] = {}
        for sp in shard_paths:
            for name, info in _read_header(sp).items():
                (ignored if name.startswith(IGNORED_PREFIXES) else infos)[name] = info

        if index is not None:  # the index must say where each tensor really is
            for name, f in index.items():
                info = infos.get(name) or ignored.get(name)
                if info is not None and info.file.name != f:
                    raise CheckpointError(f"{index_path}: maps tensor {name} to {f}, but it is in {info.file.name}")
        want = PREFIX_MULTIMODAL if config.multimodal else PREFIX_TEXT
        other = PREFIX_TEXT if config.multimodal else PREFIX_MULTIMODAL
        if not any(n.startswith(want + "layers.") for n in infos):
            found = [n for n in infos if n.startswith(other + "layers.")]
            why = ("has text_config (multimodal)" if config.multimodal else "has no text_config (text-only)")
            hint = f"; the tensors are named {other}layers.* (e.g. {found[0]})" if found else ""
            raise CheckpointError(
                f"{cfg_path}: config {why}, so tensors should be named {want}layers.*, but none are{hint}")
        return cls(path, config, quant, infos, ignored, index, want)

    # -- names and metadata

    @property
    def files(self) -> list[Path]:
        return sorted({i.file for i in (*self._infos.values(), *self._ignored.values())})

    def names(self) -> list[str]:
        """Tensor names of the text model and head (visual and mtp tensors are left out)."""
        return list(self._infos)

    def has(self, name: str) -> bool:
        return name in self._infos

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            pass
        if self._index is not None and name in self._index:
            raise CheckpointError(f"{self.path / self._index[name]}: tensor {name} is listed in {INDEX_FILE} "
                                  "for this file but the file does not contain it")
        where = ", ".join(str(f) for f in self.files)
        raise CheckpointError(f"{where}: tensor {name} is missing")

    def layer_prefix(self, layer: int) -> str:
        return f"{self.prefix}layers.{layer}."

    def read_tensor(self, name: str) -> torch.Tensor:
        """One tensor by its full name, read alone (e.g. the next layer's input norm)."""
        with _Reader(self) as rd:
            return rd.read(name)

    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self._infos.values())

    def layer_bytes(self, layer: int) -> int:
        p = self.layer_prefix(layer)
        return sum(i.nbytes for n, i in self._infos.items() if n.startswith(p))

    def ignored_names(self) -> list[str]:
        return list(self._ignored)

    def layout(self, layer: int) -> dict[str, str | None]:
        """How this layer is stored: GDN naming ("split"/"fused"/None) and experts ("per_expert"/"fused")."""
        p = self.layer_prefix(layer)
        gdn = None
        if self.config.layer_type(layer) == GDN:
            gdn = "fused" if self.has(p + "linear_attn.in_proj_qkvz.weight") else "split"
        experts = "fused" if self.has(p + "mlp.experts.gate_up_proj") else "per_expert"
        return {"gdn": gdn, "experts": experts}

    # -- expected tensors

    def layer_specs(self, layer: int) -> dict[str, Spec]:
        """Every tensor (group) the layer should hold, keyed by its name without the layer prefix."""
        c, p = self.config, self.layer_prefix(layer)
        H, E, I, Is = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
        lay = self.layout(layer)
        s: dict[str, Spec] = {
            "input_layernorm.weight": Param(p + "input_layernorm.weight", (H,)),
            "post_attention_layernorm.weight": Param(p + "post_attention_layernorm.weight", (H,)),
        }
        la = p + "linear_attn."
        if lay["gdn"] == "split":
            s["linear_attn.in_proj_qkv"] = QTensor.linear(la + "in_proj_qkv", (c.conv_dim, H))
            s["linear_attn.in_proj_z"] = QTensor.linear(la + "in_proj_z", (c.value_dim, H))
            s["linear_attn.in_proj_b"] = QTensor.linear(la + "in_proj_b", (c.linear_num_value_heads, H))
            s["linear_attn.in_proj_a"] = QTensor.linear(la + "in_proj_a", (c.linear_num_value_heads, H))
        elif lay["gdn"] == "fused":
            s["linear_attn.in_proj_qkvz"] = QTensor.linear(la + "in_proj_qkvz", (c.conv_dim + c.value_dim, H))
            s["linear_attn.in_proj_ba"] = QTensor.linear(la + "in_proj_ba", (2 * c.linear_num_value_heads, H))
        if lay["gdn"]:
            s["linear_attn.conv1d.weight"] = Param(la + "conv1d.weight", (c.conv_dim, 1, c.linear_conv_kernel_dim))
            s["linear_attn.A_log"] = Param(la + "A_log", (c.linear_num_value_heads,))
            s["linear_attn.dt_bias"] = Param(la + "dt_bias", (c.linear_num_value_heads,))
            s["linear_attn.norm.weight"] = Param(la + "norm.weight", (c.linear_value_head_dim,))
            s["linear_attn.out_proj"] = QTensor.linear(la + "out_proj", (H, c.value_dim))
        else:
            sa, hd = p + "self_attn.", c.head_dim
            s["self_attn.q_proj"] = QTensor.linear(sa + "q_proj", (2 * c.num_attention_heads * hd, H))
            s["self_attn.k_proj"] = QTensor.linear(sa + "k_proj", (c.num_key_value_heads * hd, H))
            s["self_attn.v_proj"] = QTensor.linear(sa + "v_proj", (c.num_key_value_heads * hd, H))
            s["self_attn.o_proj"] = QTensor.linear(sa + "o_proj", (H, c.num_attention_heads * hd))
            s["self_attn.q_norm.weight"] = Param(sa + "q_norm.weight", (hd,))
            s["self_attn.k_norm.weight"] = Param(sa + "k_norm.weight", (hd,))
        m = p + "mlp."
        s["mlp.gate.weight"] = Param(m + "gate.weight", (E, H), strict=True)
        if lay["experts"] == "fused":
            s["mlp.experts.gate_up_proj"] = QTensor.fused(m + "experts.gate_up_proj", (E, 2 * I, H))
            s["mlp.experts.down_proj"] = QTensor.fused(m + "experts.down_proj", (E, H, I))
        else:
            for e in range(E):
                for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                    key = f"mlp.experts.{e}.{proj}"
                    s[key] = QTensor.linear(p + key, shape)
        for proj, shape in (("gate_proj", (Is, H)), ("up_proj", (Is, H)), ("down_proj", (H, Is))):
            s[f"mlp.shared_expert.{proj}"] = QTensor.linear(m + f"shared_expert.{proj}", shape)
        s["mlp.shared_expert_gate.weight"] = Param(m + "shared_expert_gate.weight", (1, H), strict=True)
        return s

    def head_specs(self) -> dict[str, Spec]:
        c = self.config
        s: dict[str, Spec] = {
            "embed_tokens.weight": Param(self.prefix + "embed_tokens.weight", (c.vocab_size, c.hidden_size), strict=True),
            "norm.weight": Param(self.prefix + "norm.weight", (c.hidden_size,)),
        }
        if not c.tie_word_embeddings or self.has("lm_head.weight"):
            s["lm_head"] = QTensor.linear("lm_head", (c.vocab_size, c.hidden_size))
        return s

    # -- validation (metadata, plus zero-point values)

    def _check_param(self, p: Param) -> TensorInfo:
        info = self.info(p.name)
        allowed = ("BF16",) if p.strict else _FLOATS
        if info.dtype not in allowed:
            raise CheckpointError(f"{info.file}: tensor {p.name} is {info.dtype}, expected {' or '.join(allowed)}")
        if info.shape != p.shape:
            raise CheckpointError(
                f"{info.file}: tensor {p.name} has shape {list(info.shape)}, config.json implies {list(p.shape)}")
        return info

    def _check_q(self, rd: _Reader, q: QTensor) -> str:
        """Validate one linear against the quant scheme; returns its scheme."""
        scheme = self.quant.scheme_for(q.module)
        info = self.info(q.weight)
        if info.shape != q.shape:
            raise CheckpointError(
                f"{info.file}: tensor {q.weight} has shape {list(info.shape)}, config.json implies {list(q.shape)}")
        if scheme == BF16:
            if info.dtype != "BF16":
                why = ("the checkpoint has no quantization_config" if self.quant.quant_method is None
                       else "quantization_config leaves it unquantised (excluded or not matched)")
                raise CheckpointError(f"{info.file}: tensor {q.weight} is {info.dtype}, but {q.module} must be "
                                      f"BF16: {why}")
            if self.has(q.scale):
                raise CheckpointError(f"{self.info(q.scale).file}: tensor {q.scale} exists, but {q.module} is BF16 "
                                      "by quantization_config")
            return BF16
        if info.dtype != "I8":
            raise CheckpointError(f"{info.file}: tensor {q.weight} is {info.dtype}, but quantization_config makes "
                                  f"{q.module} W8A8 INT8, so it must be I8 (int8)")
        if not self.has(q.scale):
            raise CheckpointError(f"{info.file}: int8 tensor {q.weight} has no scale tensor {q.scale}")
        sinfo = self.info(q.scale)
        want = q.shape[:-1]
        if sinfo.shape not in (want, want + (1,)):
            raise CheckpointError(f"{sinfo.file}: tensor {q.scale} has shape {list(sinfo.shape)}, expected "
                                  f"{list(want)} (one scale per output channel of {q.weight})")
        if sinfo.dtype not in _FLOATS:
            raise CheckpointError(f"{sinfo.file}: tensor {q.scale} is {sinfo.dtype}, expected a float scale")
        if self.has(q.zero_point):
            zinfo = self.info(q.zero_point)
            if zinfo.shape not in (want, want + (1,)) or zinfo.dtype not in ("I8", "U8"):
                raise CheckpointError(f"{zinfo.file}: tensor {q.zero_point} is {zinfo.dtype} {list(zinfo.shape)}, "
                                      f"expected int8 {list(want)}")
            zp = rd.read(q.zero_point)
            nz = torch.nonzero(zp.reshape(-1))
            if nz.numel():
                i = int(nz[0])
                raise CheckpointError(
                    f"{zinfo.file}: tensor {q.zero_point} has {nz.numel()} non-zero entries (first: flat index {i} = "
                    f"{int(zp.reshape(-1)[i])}); W8A8 INT8 here is symmetric, zero points must be 0")
        return W8A8_INT8

    def check_all(self) -> list[str]:
        """Validate every tensor of every layer and the head; returns the problems found (data not kept)."""
        problems: list[str] = []
        expected: set[str] = set()
        groups = [(f"layer {i}", self.layer_specs(i)) for i in range(self.config.num_hidden_layers)]
        groups.append(("head", self.head_specs()))
        with _Reader(self) as rd:
            for label, specs in groups:
                expert_schemes: set[str] = set()
                for key, spec in specs.items():
                    try:
                        if isinstance(spec, Param):
                            expected.add(spec.name)
                            self._check_param(spec)
                        else:
                            expected.update(spec.names())
                            sc = self._check_q(rd, spec)
                            if key.startswith("mlp.experts."):
                                expert_schemes.add(sc)
                    except CheckpointError as e:
                        problems.append(str(e))
                if len(expert_schemes) > 1:
                    problems.append(f"{label}: routed experts mix W8A8 and BF16; not supported")
        for name in self._infos:
            if name not in expected:
                problems.append(f"{self._infos[name].file}: unexpected tensor {name}")
        return problems

    # -- loading

    def _tp(self, tp_rank: int, tp_size: int) -> tuple[int, int]:
        if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
            raise CheckpointError(f"tp_size must be a positive int, got {tp_size!r}")
        if not isinstance(tp_rank, int) or isinstance(tp_rank, bool) or not 0 <= tp_rank < tp_size:
            raise CheckpointError(f"tp_rank must be an int in 0..{tp_size - 1}, got {tp_rank!r}")
        c = self.config
        for name in ("linear_num_key_heads", "linear_num_value_heads", "moe_intermediate_size",
                     "shared_expert_intermediate_size"):
            v = getattr(c, name)
            if v % tp_size:
                raise CheckpointError(f"{self.path}: tp_size {tp_size} does not divide {name} = {v}")
        return tp_rank, tp_size

    def _linear(self, rd: _Reader, q: QTensor, rows: Ranges | None = None, cols: Ranges | None = None) -> Linear:
        """Read a (possibly stacked) linear, optionally only some output rows or input columns."""
        scheme = self._check_q(rd, q)
        nd = len(q.shape)
        if rows is not None:
            w = rd.read(q.weight, nd - 2, rows)
        elif cols is not None:
            w = rd.read(q.weight, nd - 1, cols)
        else:
            w = rd.read(q.weight)
        if scheme == BF16:
            return Linear(w)
        s = rd.read(q.scale).float().reshape(q.shape[:-1])  # scales are small: read whole, then slice
        if rows is not None:
            s = torch.cat([s.narrow(-1, lo, hi - lo) for lo, hi in rows], dim=-1)
        return Linear(w, s.contiguous())

    def _param(self, rd: _Reader, p: Param, ranges: Ranges | None = None) -> torch.Tensor:
        self._check_param(p)
        return rd.read(p.name, 0, ranges) if ranges is not None else rd.read(p.name)

    def load_layer(self, layer: int, tp_rank: int = 0, tp_size: int = 1) -> LayerWeights:
        """One layer's norms, MoE and (GDN layers) GDN weights, sharded for `tp_rank` of `tp_size`."""
        ltype = self.config.layer_type(layer)
        r, n = self._tp(tp_rank, tp_size)
        specs = self.layer_specs(layer)
        with _Reader(self) as rd:
            gdn = self._load_gdn(rd, layer, specs, r, n) if ltype == GDN else None
            moe = self._load_moe(rd, specs, r, n)
            return LayerWeights(
                index=layer, layer_type=ltype,
                input_layernorm=self._param(rd, specs["input_layernorm.weight"]),
                post_attention_layernorm=self._param(rd, specs["post_attention_layernorm.weight"]),
                moe=moe, gdn=gdn, tp_rank=r, tp_size=n)

    def _load_gdn(self, rd: _Reader, layer: int, s: dict[str, Spec], r: int, n: int) -> GDNWeights:
        c = self.config
        Hk, Hv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        hk, hv, ratio = Hk // n, Hv // n, Hv // Hk
        kd = Hk * dk
        # canonical [q | k | v] channels of this rank: each part split by heads
        qkv_rows = [(r * hk * dk, (r + 1) * hk * dk), (kd + r * hk * dk, kd + (r + 1) * hk * dk),
                    (2 * kd + r * hv * dv, 2 * kd + (r + 1) * hv * dv)]
        vrows = [(r * hv * dv, (r + 1) * hv * dv)]
        heads = [(r * hv, (r + 1) * hv)]
        if self.layout(layer)["gdn"] == "fused":
            g = 2 * dk + 2 * ratio * dv  # rows per key-head group; this rank's groups are contiguous
            qkvz = self._linear(rd, s["linear_attn.in_proj_qkvz"], rows=[(r * hk * g, (r + 1) * hk * g)])
            ba = self._linear(rd, s["linear_attn.in_proj_ba"], rows=[(r * hk * 2 * ratio, (r + 1) * hk * 2 * ratio)])
            qkv_w, z_w = deinterleave_qkvz(qkvz.weight, hk, dk, dv, ratio)
            b_w, a_w = deinterleave_ba(ba.weight, hk, ratio)
            qkv_s = z_s = b_s = a_s = None
            if qkvz.scale is not None:
                qkv_s, z_s = deinterleave_qkvz(qkvz.scale, hk, dk, dv, ratio)
            if ba.scale is not None:
                b_s, a_s = deinterleave_ba(ba.scale, hk, ratio)
            qkv, z = Linear(qkv_w.contiguous(), qkv_s), Linear(z_w.contiguous(), z_s)
            b, a = Linear(b_w.contiguous(), b_s), Linear(a_w.contiguous(), a_s)
        else:
            qkv = self._linear(rd, s["linear_attn.in_proj_qkv"], rows=qkv_rows)
            z = self._linear(rd, s["linear_attn.in_proj_z"], rows=vrows)
            b = self._linear(rd, s["linear_attn.in_proj_b"], rows=heads)
            a = self._linear(rd, s["linear_attn.in_proj_a"], rows=heads)
        return GDNWeights(
            in_proj_qkv=qkv, in_proj_z=z, in_proj_b=b, in_proj_a=a,
            conv1d_weight=self._param(rd, s["linear_attn.conv1d.weight"], qkv_rows),
            A_log=self._param(rd, s["linear_attn.A_log"], heads),
            dt_bias=self._param(rd, s["linear_attn.dt_bias"], heads),
            norm_weight=self._param(rd, s["linear_attn.norm.weight"]),
            out_proj=self._linear(rd, s["linear_attn.out_proj"], cols=vrows))

    def _load_moe(self, rd: _Reader, s: dict[str, Spec], r: int, n: int) -> MoEWeights:
        c = self.config
        E, I, Is = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
        i, si = I // n, Is // n
        if "mlp.experts.gate_up_proj" in s:
            gu = s["mlp.experts.gate_up_proj"]
            w13 = self._linear(rd, gu, rows=[(r * i, (r + 1) * i), (I + r * i, I + (r + 1) * i)])
            w2 = self._linear(rd, s["mlp.experts.down_proj"], cols=[(r * i, (r + 1) * i)])
            if w13.quantized != w2.quantized:
                raise CheckpointError(f"{self.info(gu.weight).file}: {gu.module} and its down_proj differ in "
                                      "quantisation (one W8A8, one BF16); not supported")
            experts = Experts(w13.weight, w13.scale, w2.weight, w2.scale)
        else:
            experts = self._per_expert(rd, s, r, i)
        sg = self._linear(rd, s["mlp.shared_expert.gate_proj"], rows=[(r * si, (r + 1) * si)])
        su = self._linear(rd, s["mlp.shared_expert.up_proj"], rows=[(r * si, (r + 1) * si)])
        sd = self._linear(rd, s["mlp.shared_expert.down_proj"], cols=[(r * si, (r + 1) * si)])
        if not sg.quantized == su.quantized == sd.quantized:
            raise CheckpointError(f"{self.info(s['mlp.shared_expert.gate_proj'].weight).file}: shared expert "
                                  "projections mix W8A8 and BF16; not supported")
        gate_up = Linear(torch.cat([sg.weight, su.weight]),
                         torch.cat([sg.scale, su.scale]) if sg.quantized else None)
        return MoEWeights(
            gate=self._param(rd, s["mlp.gate.weight"]),
            experts=experts, shared_gate_up=gate_up, shared_down=sd,
            shared_expert_gate=self._param(rd, s["mlp.shared_expert_gate.weight"]))

    def _per_expert(self, rd: _Reader, s: dict[str, Spec], r: int, i: int) -> Experts:
        E = self.config.num_experts
        rows, cols = [(r * i, (r + 1) * i)], [(r * i, (r + 1) * i)]
        w13 = w2 = s13 = s2 = None
        first = s["mlp.experts.0.gate_proj"]
        for e in range(E):
            g = self._linear(rd, s[f"mlp.experts.{e}.gate_proj"], rows=rows)
            u = self._linear(rd, s[f"mlp.experts.{e}.up_proj"], rows=rows)
            d = self._linear(rd, s[f"mlp.experts.{e}.down_proj"], cols=cols)
            if w13 is None:
                quant = g.quantized
                w13 = torch.empty((E, 2 * i, g.in_features), dtype=g.weight.dtype)
                w2 = torch.empty((E, d.out_features, i), dtype=d.weight.dtype)
                if quant:
                    s13, s2 = torch.empty((E, 2 * i)), torch.empty((E, d.out_features))
            if not g.quantized == u.quantized == d.quantized == quant:
                raise CheckpointError(f"{self.info(first.weight).file}: routed experts of {first.module.rsplit('.', 2)[0]} "
                                      f"mix W8A8 and BF16 (expert {e}); not supported")
            w13[e, :i], w13[e, i:], w2[e] = g.weight, u.weight, d.weight
            if quant:
                s13[e, :i], s13[e, i:], s2[e] = g.scale, u.scale, d.scale
        return Experts(w13, s13, w2, s2)

    def load_head(self, rows: Sequence[int] | slice | range | torch.Tensor | None = None) -> HeadWeights:
        """Embedding, final norm and lm_head; `rows` keeps only those vocabulary rows (in that order).

        Tied embeddings: lm_head is the embedding tensor. A quantised lm_head is dequantised to bf16.
        """
        s = self.head_specs()
        V = self.config.vocab_size
        runs, order = _row_runs(rows, V, "the vocabulary") if rows is not None else (None, None)

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t.index_select(0, order) if order is not None else t

        with _Reader(self) as rd:
            emb = pick(self._param(rd, s["embed_tokens.weight"], runs))
            norm = self._param(rd, s["norm.weight"])
            if "lm_head" in s:
                lm = self._linear(rd, s["lm_head"], rows=runs)
                head = lm.weight if lm.scale is None else (lm.weight.float() * lm.scale[:, None]).to(torch.bfloat16)
                head = pick(head)
            else:
                head = emb
        return HeadWeights(embed_tokens=emb, norm=norm, lm_head=head)


# --------------------------------------------------------------------------- TP shards back together


def _same(tensors: Iterable[torch.Tensor], what: str) -> torch.Tensor:
    ts = list(tensors)
    for t in ts[1:]:
        if not torch.equal(t, ts[0]):
            raise ValueError(f"replicated tensor {what} differs between TP shards")
    return ts[0]


def _cat_opt(ts: list[torch.Tensor | None], dim: int) -> torch.Tensor | None:
    return None if ts[0] is None else torch.cat(ts, dim)


def _merge_gate_up(ts: list[torch.Tensor | None], dim: int) -> torch.Tensor | None:
    """Shards hold [gate_r; up_r] along `dim`: gather all gates, then all ups."""
    if ts[0] is None:
        return None
    halves = [t.chunk(2, dim) for t in ts]
    return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim)


def merge_shards(shards: Sequence[LayerWeights]) -> LayerWeights:
    """Concatenate TP shards (ranks 0..N-1 in order) back into the full layer (inverse of TP loading)."""
    shards = sorted(shards, key=lambda w: w.tp_rank)
    if [w.tp_rank for w in shards] != list(range(len(shards))):
        raise ValueError(f"need one shard per rank 0..{len(shards) - 1}, got ranks {[w.tp_rank for w in shards]}")
    w0 = shards[0]
    gdn = None
    if w0.gdn is not None:
        gs = [w.gdn for w in shards]

        def split_qkv(t: torch.Tensor, g: GDNWeights) -> list[torch.Tensor]:
            kd = (g.in_proj_qkv.out_features - g.in_proj_z.out_features) // 2  # local Hk*dk
            return list(torch.split(t, [kd, kd, g.in_proj_z.out_features]))

        def merge_qkv(ts: list[torch.Tensor | None]) -> torch.Tensor | None:
            if ts[0] is None:
                return None
            parts = [split_qkv(t, g) for t, g in zip(ts, gs)]
            return torch.cat([p[j] for j in range(3) for p in parts])

        gdn = GDNWeights(
            in_proj_qkv=Linear(merge_qkv([g.in_proj_qkv.weight for g in gs]), merge_qkv([g.in_proj_qkv.scale for g in gs])),
            in_proj_z=Linear(torch.cat([g.in_proj_z.weight for g in gs]), _cat_opt([g.in_proj_z.scale for g in gs], 0)),
            in_proj_b=Linear(torch.cat([g.in_proj_b.weight for g in gs]), _cat_opt([g.in_proj_b.scale for g in gs], 0)),
            in_proj_a=Linear(torch.cat([g.in_proj_a.weight for g in gs]), _cat_opt([g.in_proj_a.scale for g in gs], 0)),
            conv1d_weight=merge_qkv([g.conv1d_weight for g in gs]),
            A_log=torch.cat([g.A_log for g in gs]),
            dt_bias=torch.cat([g.dt_bias for g in gs]),
            norm_weight=_same((g.norm_weight for g in gs), "linear_attn.norm.weight"),
            out_proj=Linear(torch.cat([g.out_proj.weight for g in gs], 1),
                            None if gs[0].out_proj.scale is None else _same((g.out_proj.scale for g in gs), "out_proj scale")),
        )
    ms = [w.moe for w in shards]
    ex = [m.experts for m in ms]
    moe = MoEWeights(
        gate=_same((m.gate for m in ms), "mlp.gate.weight"),
        experts=Experts(
            w13=_merge_gate_up([e.w13 for e in ex], 1), w13_scale=_merge_gate_up([e.w13_scale for e in ex], 1),
            w2=torch.cat([e.w2 for e in ex], 2),
            w2_scale=None if ex[0].w2_scale is None else _same((e.w2_scale for e in ex), "experts w2 scale")),
        shared_gate_up=Linear(_merge_gate_up([m.shared_gate_up.weight for m in ms], 0),
                              _merge_gate_up([m.shared_gate_up.scale for m in ms], 0)),
        shared_down=Linear(torch.cat([m.shared_down.weight for m in ms], 1),
                           None if ms[0].shared_down.scale is None else _same((m.shared_down.scale for m in ms), "shared down scale")),
        shared_expert_gate=_same((m.shared_expert_gate for m in ms), "mlp.shared_expert_gate.weight"),
    )
    return LayerWeights(
        index=w0.index, layer_type=w0.layer_type,
        input_layernorm=_same((w.input_layernorm for w in shards), "input_layernorm.weight"),
        post_attention_layernorm=_same((w.post_attention_layernorm for w in shards), "post_attention_layernorm.weight"),
        moe=moe, gdn=gdn, tp_rank=0, tp_size=1)
