"""Quark W8A8 INT8 ("ptpc_int8"): the `quantization_config` a Quark export writes, and its math.

Supported scheme, the one the production checkpoint uses: int8 weights, symmetric, per output
channel (`ch_axis 0`, static), with int8 activations quantised dynamically per token
(`ch_axis 1`, symmetric). Any module the config does not quantise is BF16; a checkpoint without
`quantization_config` is all BF16. Anything else is refused with a `CheckpointError`.

Quark's symmetric int8 uses the full range: `scale = amax / 127.5` and
`q = clamp(round_half_even(x / scale), -128, 127)`, so -128 does occur.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from typing import Iterable, Mapping

import torch

from ..errors import CheckpointError

W8A8_INT8 = "w8a8_int8"
BF16 = "bf16"
QUARK_VERSION = "0.13"
QMIN, QMAX = -128, 127
# Quark's symmetric scale divides amax by half the full int8 range: (127 - (-128)) / 2.
SCALE_DIVISOR = (QMAX - QMIN) / 2.0


# --------------------------------------------------------------------------- config


def weight_spec() -> dict:
    """The `weight` QuantizationSpec a Quark 0.13 export writes for ptpc_int8."""
    return {
        "dtype": "int8", "is_dynamic": False, "qscheme": "per_channel", "ch_axis": 0,
        "group_size": None, "symmetric": True, "round_method": "half_even", "scale_type": "float",
        "scale_format": None, "scale_calculation_mode": None, "mx_element_dtype": None,
        "observer_cls": "PerChannelMinMaxObserver", "is_scale_quant": False,
    }


def input_spec() -> dict:
    """The `input_tensors` QuantizationSpec: dynamic per-token int8 activations."""
    return {
        "dtype": "int8", "is_dynamic": True, "qscheme": "per_channel", "ch_axis": 1,
        "group_size": None, "symmetric": True, "round_method": "half_even", "scale_type": "float",
        "scale_format": None, "scale_calculation_mode": None, "mx_element_dtype": None,
        "observer_cls": "PerChannelMinMaxObserver", "is_scale_quant": False,
    }


def ptpc_int8_layer_config() -> dict:
    """One Quark `QuantizationConfig` (per module) for ptpc_int8."""
    return {"weight": weight_spec(), "input_tensors": input_spec(), "output_tensors": None,
            "bias": None, "target_device": None}


def quark_config(exclude: Iterable[str] = (), *, layer_quant_config: Mapping[str, dict] | None = None,
                 version: str = QUARK_VERSION) -> dict:
    """The `quantization_config` a Quark 0.13 export writes: global ptpc_int8, `exclude` as given.

    `exclude` lists the modules left in BF16 by explicit name (Quark writes them out, e.g. every
    `...mlp.gate`, `...mlp.shared_expert_gate` and `lm_head`).
    """
    return {
        "quant_method": "quark",
        "version": version,
        "quant_mode": "eager_mode",
        "global_quant_config": ptpc_int8_layer_config(),
        "layer_quant_config": dict(layer_quant_config or {}),
        "layer_type_quant_config": {},
        "kv_cache_quant_config": {},
        "kv_cache_post_rope": False,
        "softmax_quant_spec": None,
        "algo_config": None,
        "exclude": list(exclude),
        "export": {"kv_cache_group": [], "min_kv_scale": 0.0, "pack_method": "reorder",
                   "weight_format": "real_quantized", "weight_merge_groups": None},
    }


def _classify(layer_cfg: object, where: str) -> str:
    """Scheme of one Quark per-module config: W8A8_INT8, BF16 (nothing quantised), else error."""
    if layer_cfg is None:
        return BF16
    if not isinstance(layer_cfg, Mapping):
        raise CheckpointError(f"{where}: expected a dict, found {type(layer_cfg).__name__}")
    w, x = layer_cfg.get("weight"), layer_cfg.get("input_tensors")
    if not w and not x:
        return BF16
    if isinstance(w, list) or isinstance(x, list):
        raise CheckpointError(f"{where}: multi-spec (list) quantisation is not supported, found {w or x}")

    def check(spec: object, name: str, want: dict) -> None:
        if not isinstance(spec, Mapping) or not spec:
            raise CheckpointError(
                f"{where}: W8A8 INT8 needs both weight and input_tensors specs; {name} is {spec!r}")
        bad = {k: spec.get(k) for k, v in want.items() if spec.get(k) != v}
        if bad:
            found = ", ".join(f"{k}={v!r}" for k, v in bad.items())
            expect = ", ".join(f"{k}={want[k]!r}" for k in bad)
            raise CheckpointError(
                f"{where}: unsupported {name} quantisation ({found}); only int8 per-channel symmetric "
                f"weights with dynamic per-token int8 activations are supported (expected {expect})")

    check(w, "weight", {"dtype": "int8", "qscheme": "per_channel", "ch_axis": 0, "symmetric": True,
                        "is_dynamic": False})
    check(x, "input_tensors", {"dtype": "int8", "qscheme": "per_channel", "ch_axis": 1, "symmetric": True,
                               "is_dynamic": True})
    for extra in ("output_tensors", "bias"):
        if layer_cfg.get(extra):
            raise CheckpointError(f"{where}: {extra} quantisation is not supported, found {layer_cfg[extra]!r}")
    return W8A8_INT8


def _matches(name: str, pattern: str) -> bool:
    """Quark-style module match: exact name, `re:<regex>`, or an fnmatch pattern."""
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


@dataclass(frozen=True)
class QuantScheme:
    """Which modules are W8A8 INT8 and which are BF16, as a checkpoint's config says."""

    quant_method: str | None = None
    version: str | None = None
    global_scheme: str = BF16
    layer_schemes: tuple[tuple[str, str], ...] = ()  # (pattern, scheme), first match wins
    type_scheme: str | None = None  # layer_type_quant_config entry for Linear, if any
    exclude: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, qc: Mapping | None, source: str = "config.json") -> "QuantScheme":
        """Parse a `quantization_config` dict (None: all BF16). `source` names the file in errors."""
        if qc is None:
            return cls()
        where = f"{source}: quantization_config"
        if not isinstance(qc, Mapping):
            raise CheckpointError(f"{where} is a {type(qc).__name__}, expected a dict")
        method = qc.get("quant_method")
        if method != "quark":
            raise CheckpointError(
                f"{where}: quant_method {method!r} is not supported (only 'quark' W8A8 INT8, or no "
                "quantization_config for BF16)")
        glob = _classify(qc.get("global_quant_config"), f"{where}.global_quant_config")
        lqc = qc.get("layer_quant_config") or {}
        ltqc = qc.get("layer_type_quant_config") or {}
        for key, val in (("layer_quant_config", lqc), ("layer_type_quant_config", ltqc)):
            if not isinstance(val, Mapping):
                raise CheckpointError(f"{where}.{key} is a {type(val).__name__}, expected a dict")
        layers = tuple((str(p), _classify(c, f"{where}.layer_quant_config[{p!r}]")) for p, c in lqc.items())
        type_scheme = None
        for t, c in ltqc.items():
            s = _classify(c, f"{where}.layer_type_quant_config[{t!r}]")
            if str(t).split(".")[-1] == "Linear":  # every module the islands use is a Linear
                type_scheme = s
        exclude = qc.get("exclude") or []
        if isinstance(exclude, str) or not all(isinstance(e, str) for e in exclude):
            raise CheckpointError(f"{where}.exclude must be a list of module names, found {exclude!r}")
        return cls(quant_method="quark", version=qc.get("version"), global_scheme=glob,
                   layer_schemes=layers, type_scheme=type_scheme, exclude=tuple(exclude))

    @property
    def quantized(self) -> bool:
        """True when any module can be W8A8."""
        return W8A8_INT8 in (self.global_scheme, self.type_scheme, *(s for _, s in self.layer_schemes))

    def scheme_for(self, module_name: str) -> str:
        """`"w8a8_int8"` or `"bf16"` for a full module name (no `.weight`), e.g. `lm_head`."""
        if any(_matches(module_name, p) for p in self.exclude):
            return BF16
        for pattern, scheme in self.layer_schemes:
            if _matches(module_name, pattern):
                return scheme
        if self.type_scheme is not None:
            return self.type_scheme
        return self.global_scheme

    def describe(self) -> str:
        if self.quant_method is None:
            return "none (all BF16)"
        return (f"quark {self.version or '?'}: int8 per-channel symmetric weights, dynamic per-token int8 "
                f"activations; {len(self.exclude)} excluded module name(s)")


# --------------------------------------------------------------------------- math


def quantize_rows(x: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 along the last dim: returns (int8 like x, fp32 scale of shape x.shape[:-1]).

    `scale = amax / 127.5` (amax 0 guarded by fp32 eps). With `scale_dtype=torch.bfloat16` the
    scale is rounded to bf16 *before* quantising, so the stored bf16 scale is the one used.
    """
    xf = x.float()
    amax = xf.abs().amax(dim=-1)
    scale = (amax / SCALE_DIVISOR).clamp_min(torch.finfo(torch.float32).eps)
    scale = scale.to(scale_dtype).float()
    q = torch.round(xf / scale.unsqueeze(-1)).clamp_(QMIN, QMAX).to(torch.int8)  # round = half even
    return q, scale


def quantize_weight(w: torch.Tensor, scale_dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output channel: w [N, K] (or stacked [E, N, K]) -> (int8 same shape, fp32 scale [N] / [E, N])."""
    if w.dim() < 2:
        raise ValueError(f"quantize_weight needs a [N, K] weight, got shape {tuple(w.shape)}")
    return quantize_rows(w, scale_dtype)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token activation quantisation (same rule): x [T, K] -> (int8 [T, K], fp32 [T])."""
    return quantize_rows(x)


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q [..., N, K] int8, scale [..., N] -> q * scale in `dtype`."""
    return (q.float() * scale.float().unsqueeze(-1)).to(dtype)
