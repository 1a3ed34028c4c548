"""Write small checkpoints in the exact layout a Quark export of the production model has.

Names, dtypes, shapes and `quantization_config` follow DESIGN.md ("W8A8 INT8"): int8 weights,
1-D bf16 `weight_scale`, int8 all-zero `weight_zero_point`, explicit `exclude` names. Random
BF16 weights are deterministic for a seed (and device), and do not depend on the layout options:
the same seed gives the same canonical weights whatever `naming`, `experts`, `multimodal` or
`shards` are. A few `model.visual.*` / `mtp.*` placeholders are written so that loaders must skip
them, as they must in the real checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import save_file

from .checkpoint import INDEX_FILE, SINGLE_FILE, interleave_ba, interleave_qkvz
from .config import GDN, PRESETS, ModelConfig
from ..errors import BadInput
from ..io import cache_dir, new_file_mode
from .quant import quantize_weight, quark_config

QUANTISED = ("production", "experts", "none")
NAMINGS = ("split", "fused")
EXPERT_LAYOUTS = ("per_expert", "fused")
DEFAULT_NAME = "tiny-seed0-v1"


DIGEST_FILE = ".repro-digest.json"  # sha256 of every file make_tiny wrote: the cache is verified on use


def default_checkpoint(cache=None) -> Path:
    """The embedded default tiny checkpoint in the cache (`cache`: `io.cache_dir`'s root),
    generated on first use (atomically) and reused after.
    A cached copy whose files no longer match their digests (a disk error, an edit, a half-copied
    cache) is rebuilt, with a note on stderr, rather than failing every run."""
    target = cache_dir(cache) / DEFAULT_NAME
    if (target / "config.json").is_file():
        problem = verify(target)
        if problem is None:
            return target
        print(f"repro: the cached tiny checkpoint is damaged ({problem}); rebuilding {target}", file=sys.stderr)
        try:
            make_tiny(target, seed=0, overwrite=True)
        except OSError as e:
            raise BadInput(f"{target}: cannot rebuild the cached checkpoint ({e.strerror or e}); delete it") from e
        return target
    try:
        make_tiny(target, seed=0)
    except BadInput:
        if not (target / "config.json").is_file():  # not a lost race: a real problem
            raise
    return target


def _digests(d: Path) -> dict[str, str]:
    out = {}
    for f in sorted(d.iterdir()):
        if f.is_file() and f.name != DIGEST_FILE:
            out[f.name] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def verify(path: Path) -> str | None:
    """None if every file of a make_tiny checkpoint matches the digest written with it, else what
    does not (a checkpoint written before digests existed counts as damaged: it is regenerated)."""
    try:
        want = json.loads((path / DIGEST_FILE).read_text())
        have = _digests(path)
    except (OSError, ValueError) as e:
        return f"no readable {DIGEST_FILE} ({e.__class__.__name__})"
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            return f"{name} {'is missing' if name not in have else 'differs from its digest'}"
    return None


def clean_stale_tmp(parent: Path, name: str, max_age_s: float = 3600.0) -> None:
    """Remove `.NAME.tmp-PID-*` folders a killed make_tiny left: their process is gone, or they
    are older than `max_age_s` (a reused pid). A live writer's folder is left alone."""
    try:
        entries = list(parent.glob(f".{name}.tmp-*"))
    except OSError:
        return
    for e in entries:
        try:
            pid = int(e.name.rsplit(".tmp-", 1)[1].split("-")[0])
            os.kill(pid, 0)
            alive = time.time() - e.stat().st_mtime < max_age_s
        except ProcessLookupError:
            alive = False
        except (ValueError, IndexError, PermissionError, OSError):
            alive = True
        if not alive:
            shutil.rmtree(e, ignore_errors=True)


def estimate_bytes(cfg: ModelConfig) -> int:
    """Bytes of the text model's tensors at 2 bytes a parameter (bf16), roughly: checked before
    generating, so that the full-size preset fails with one line instead of the OOM killer."""
    H, L, V = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    experts = 3 * cfg.num_experts * cfg.moe_intermediate_size * H
    shared = 3 * cfg.shared_expert_intermediate_size * H
    attn = (cfg.conv_dim + cfg.value_dim + 2 * cfg.linear_num_value_heads) * H + H * cfg.value_dim
    return 2 * (L * (experts + shared + attn) + 2 * V * H)


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


class _Gen:
    """Deterministic random tensors (fp32 draws cast to bf16) on one device."""

    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.g = torch.Generator(device=device)
        self.g.manual_seed(seed)

    def normal(self, shape: tuple[int, ...], std: float, mean: float = 0.0) -> torch.Tensor:
        t = torch.randn(shape, generator=self.g, device=self.device) * std + mean
        return t.to(torch.bfloat16)

    def linear(self, n: int, k: int) -> torch.Tensor:
        return self.normal((n, k), 1.0 / math.sqrt(k))

    def uniform(self, shape: tuple[int, ...], lo: float, hi: float) -> torch.Tensor:
        return torch.rand(shape, generator=self.g, device=self.device) * (hi - lo) + lo


class _Writer:
    """Collects named tensors; quantises the linears the plan says to, in Quark's stored form."""

    def __init__(self, quantise: set[str]):
        self.quantise = quantise  # module names to store as W8A8
        self.tensors: dict[str, torch.Tensor] = {}

    def put(self, name: str, t: torch.Tensor) -> None:
        self.tensors[name] = t.detach().to("cpu").contiguous()

    def linear(self, module: str, w: torch.Tensor, fused_name: bool = False) -> None:
        """`fused_name`: a fused expert stack stored as `module` itself with `_scale`/`_zero_point`."""
        wname, sname, zname = ((module, module + "_scale", module + "_zero_point") if fused_name else
                               (module + ".weight", module + ".weight_scale", module + ".weight_zero_point"))
        if module not in self.quantise:
            self.put(wname, w)
            return
        q, scale = quantize_weight(w, scale_dtype=torch.bfloat16)
        self.put(wname, q)
        self.put(sname, scale.to(torch.bfloat16))
        self.put(zname, torch.zeros(scale.shape, dtype=torch.int8))


def _linear_modules(c: ModelConfig, naming: str, experts: str, multimodal: bool) -> list[tuple[str, str]]:
    """(module name, role) of every linear written; role decides quantisation per recipe."""
    out: list[tuple[str, str]] = []
    for i, t in enumerate(c.layer_types):
        p = f"{c.prefix}layers.{i}."
        if t == GDN:
            projs = (("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a") if naming == "split"
                     else ("in_proj_qkvz", "in_proj_ba"))
            out += [(p + "linear_attn." + n, "attn") for n in (*projs, "out_proj")]
        else:
            out += [(p + "self_attn." + n, "attn") for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        out.append((p + "mlp.gate", "router"))
        if experts == "fused":
            out += [(p + "mlp.experts.gate_up_proj", "expert"), (p + "mlp.experts.down_proj", "expert")]
        else:
            out += [(p + f"mlp.experts.{e}.{n}", "expert") for e in range(c.num_experts)
                    for n in ("gate_proj", "up_proj", "down_proj")]
        out += [(p + f"mlp.shared_expert.{n}", "shared") for n in ("gate_proj", "up_proj", "down_proj")]
        out.append((p + "mlp.shared_expert_gate", "router"))
    out.append(("lm_head", "head"))
    out.append(("mtp.fc", "extra"))
    if multimodal:
        out.append(("model.visual.merger.linear_fc1", "extra"))
    return out


def _recipe(roles: str) -> set[str]:
    return {"production": {"attn", "expert", "shared"}, "experts": {"expert"}, "none": set()}[roles]


def _units(c: ModelConfig, gen: _Gen, w: _Writer, naming: str, experts: str, multimodal: bool) -> Iterator[None]:
    """Generate the checkpoint one unit at a time (embedding, each layer, tail) into `w`.

    The random draws happen in one fixed canonical order, so layout options never change values.
    """
    H, P = c.hidden_size, c.prefix
    w.put(P + "embed_tokens.weight", gen.normal((c.vocab_size, H), 1.0))
    yield
    Hk, Hv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    E, I, Is = c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
    for i, t in enumerate(c.layer_types):
        p = f"{P}layers.{i}."
        w.put(p + "input_layernorm.weight", gen.normal((H,), 0.05))
        w.put(p + "post_attention_layernorm.weight", gen.normal((H,), 0.05))
        if t == GDN:
            la = p + "linear_attn."
            qkv, z = gen.linear(c.conv_dim, H), gen.linear(c.value_dim, H)
            b, a = gen.linear(Hv, H), gen.linear(Hv, H)
            if naming == "split":
                for n, x in (("in_proj_qkv", qkv), ("in_proj_z", z), ("in_proj_b", b), ("in_proj_a", a)):
                    w.linear(la + n, x)
            else:
                w.linear(la + "in_proj_qkvz", interleave_qkvz(qkv, z, Hk, dk, dv, Hv // Hk))
                w.linear(la + "in_proj_ba", interleave_ba(b, a, Hk, Hv // Hk))
            w.put(la + "conv1d.weight", gen.normal((c.conv_dim, 1, c.linear_conv_kernel_dim), 0.3))
            w.put(la + "A_log", torch.log(gen.uniform((Hv,), 1.0, 16.0)).to(torch.bfloat16))
            w.put(la + "dt_bias", gen.normal((Hv,), 0.1))
            w.put(la + "norm.weight", gen.normal((dv,), 0.05, mean=1.0))  # plain (not 1 + w) gated norm
            w.linear(la + "out_proj", gen.linear(H, c.value_dim))
        else:
            sa, hd, nh, nkv = p + "self_attn.", c.head_dim, c.num_attention_heads, c.num_key_value_heads
            w.linear(sa + "q_proj", gen.linear(2 * nh * hd, H))  # query and output gate
            w.linear(sa + "k_proj", gen.linear(nkv * hd, H))
            w.linear(sa + "v_proj", gen.linear(nkv * hd, H))
            w.linear(sa + "o_proj", gen.linear(H, nh * hd))
            w.put(sa + "q_norm.weight", gen.normal((hd,), 0.05))
            w.put(sa + "k_norm.weight", gen.normal((hd,), 0.05))
        m = p + "mlp."
        w.linear(m + "gate", gen.linear(E, H))
        per = [(gen.linear(I, H), gen.linear(I, H), gen.linear(H, I)) for _ in range(E)]
        if experts == "fused":
            w.linear(m + "experts.gate_up_proj", torch.stack([torch.cat([g, u]) for g, u, _ in per]), fused_name=True)
            w.linear(m + "experts.down_proj", torch.stack([d for _, _, d in per]), fused_name=True)
        else:
            for e, (g, u, d) in enumerate(per):
                for n, x in (("gate_proj", g), ("up_proj", u), ("down_proj", d)):
                    w.linear(m + f"experts.{e}.{n}", x)
        del per
        for n, shape in (("gate_proj", (Is, H)), ("up_proj", (Is, H)), ("down_proj", (H, Is))):
            w.linear(m + f"shared_expert.{n}", gen.linear(*shape))
        w.linear(m + "shared_expert_gate", gen.linear(1, H))
        yield
    w.put(P + "norm.weight", gen.normal((H,), 0.05))
    w.linear("lm_head", gen.linear(c.vocab_size, H))
    # Not ours, but present in the real checkpoint: loaders must ignore these.
    w.linear("mtp.fc", gen.linear(H, 2 * H))
    w.put("mtp.norm.weight", gen.normal((H,), 0.05))
    if multimodal:
        w.linear("model.visual.merger.linear_fc1", gen.linear(H, 64))
    yield


def _split(n: int, k: int) -> list[int]:
    """Sizes of k contiguous groups covering n units as evenly as possible."""
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def make_tiny(dir: str | Path, seed: int = 0, preset: str | ModelConfig = "tiny", quantised: str = "production",
              naming: str = "split", experts: str = "per_expert", multimodal: bool = True, shards: int = 1,
              device: str | torch.device | None = None, overwrite: bool = False) -> Path:
    """Write a checkpoint directory (atomically: a temp dir beside it, then rename). Returns its path.

    quantised: "production" (every linear W8A8 except router `mlp.gate`, `mlp.shared_expert_gate`,
    `lm_head`), "experts" (routed experts only, Quark's stock recipe) or "none" (no
    quantization_config). naming: GDN "split" (Qwen3.5/3.6) or "fused" (Qwen3-Next qkvz/ba).
    experts: "per_expert" or "fused" (`gate_up_proj`/`down_proj` stacks).
    """
    cfg = _config(preset, quantised, naming, experts, multimodal)
    units = cfg.num_hidden_layers + 2
    if not isinstance(shards, int) or not 1 <= shards <= units:
        raise BadInput(f"make_tiny: shards must be an int in 1..{units}, got {shards!r}")
    target = Path(dir)
    _check_target(target, overwrite)
    # held at once: one shard's int8 tensors (about half the bf16 bytes) and one unit's bf16 draws
    need, avail = estimate_bytes(cfg) // (2 * shards) + estimate_bytes(cfg) // units, _available_memory()
    if avail is not None and need > avail:
        name = preset if isinstance(preset, str) else cfg.model_type
        raise BadInput(f"make_tiny: preset {name} needs about {need / 2**30:.1f} GiB of memory "
                       f"with {shards} shard(s), {avail / 2**30:.1f} GiB is available (write more shards: --shards)")

    roles = _recipe(quantised)
    modules = _linear_modules(cfg, naming, experts, multimodal)
    quantise = {m for m, role in modules if role in roles}
    hf = cfg.to_hf()
    if quantised != "none":
        hf["quantization_config"] = quark_config(exclude=[m for m, _ in modules if m not in quantise])

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        clean_stale_tmp(target.parent, target.name)
        tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
    except OSError as e:
        raise BadInput(f"{target}: cannot write there ({e.strerror or e})") from e
    try:
        dev = torch.device(device) if device is not None else torch.device("cpu")
        writer = _Writer(quantise)
        gen = _Gen(seed, dev)
        sizes = _split(units, shards)
        files = [SINGLE_FILE] if shards == 1 else [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
        _write_shards(tmp, _units(cfg, gen, writer, naming, experts, multimodal), writer, files, sizes)
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        (tmp / DIGEST_FILE).write_text(json.dumps(_digests(tmp), indent=2) + "\n")
        for f in tmp.iterdir():  # safetensors' writer creates its files 0600
            os.chmod(f, new_file_mode())
        _publish(tmp, target, overwrite)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise BadInput(f"{target}: cannot write the checkpoint ({e.strerror or e})") from e
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _config(preset: str | ModelConfig, quantised: str, naming: str, experts: str, multimodal: bool) -> ModelConfig:
    """The preset's config for `make_tiny`, its options refused here where they name nothing."""
    for what, val, ok in (("quantised", quantised, QUANTISED), ("naming", naming, NAMINGS),
                          ("experts", experts, EXPERT_LAYOUTS)):
        if val not in ok:
            raise BadInput(f"make_tiny: {what}={val!r} is not one of {', '.join(ok)}")
    if isinstance(preset, ModelConfig):
        cfg = preset
    elif preset in PRESETS:
        cfg = PRESETS[preset]
    else:
        raise BadInput(f"make_tiny: unknown preset {preset!r} (known: {', '.join(PRESETS)})")
    cfg = cfg.replace(multimodal=multimodal)
    if cfg.linear_num_value_heads % cfg.linear_num_key_heads:
        raise BadInput("make_tiny: linear_num_value_heads must be a multiple of linear_num_key_heads")
    return cfg


def _check_target(target: Path, overwrite: bool) -> None:
    """A checkpoint goes into a new or empty directory (or, with `overwrite`, replaces one)."""
    try:
        if target.exists() and not target.is_dir():
            raise BadInput(f"{target}: is a file, not a directory (a checkpoint is a directory: give a new one)")
        if target.exists() and any(target.iterdir()) and not overwrite:
            raise BadInput(_NOT_EMPTY.format(target))
    except OSError as e:
        raise BadInput(f"{target}: cannot check ({e.strerror or e})") from e


def _write_shards(tmp: Path, units, writer: "_Writer", files: list[str], sizes: list[int]) -> None:
    """Draw `sizes[i]` units (`units`: `_units`' steps) into each file, and the index over them when
    there are several."""
    weight_map: dict[str, str] = {}
    total = 0
    for fname, size in zip(files, sizes):
        for _ in range(size):
            next(units)
        save_file(writer.tensors, str(tmp / fname), metadata={"format": "pt"})
        for name, t in writer.tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
        writer.tensors = {}
    if len(files) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


_NOT_EMPTY = "{}: already exists and is not empty; give a new or empty directory (repro does not replace one)"


def _publish(tmp: Path, target: Path, overwrite: bool) -> None:
    """Move the finished temp dir into place; an existing non-empty target is kept unless overwrite."""
    try:
        os.replace(tmp, target)  # atomic; succeeds over a missing or empty directory
        return
    except OSError:
        if not overwrite:
            raise BadInput(_NOT_EMPTY.format(target))
    trash = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.replace(target, trash)
    os.replace(tmp, target)
    shutil.rmtree(trash, ignore_errors=True)
