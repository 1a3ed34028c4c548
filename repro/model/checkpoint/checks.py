"""Validation of a checkpoint against its quantization_config: dtypes and shapes from the headers,
the zero points' values (W8A8 INT8 here is symmetric), and every float tensor's values through
the reader `repro run` loads with (non-finite values and negative scales refused, zero scales
flagged in `stats.flags`). `check_all` collects every problem instead of stopping at the first,
for `repro inspect`, so inspect and run agree on a damaged checkpoint.
"""
from __future__ import annotations

import torch

from ...errors import CheckpointError
from ..quant import BF16, W8A8_INT8
from .files import _FLOATS, TensorInfo, _Reader
from .layout import Param, QTensor


class _Checks:
    """`Checkpoint`'s validation (a mixin: it needs `info`, `has`, `quant`, the specs and `_infos`)."""

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

    def _check_values(self, rd: _Reader, names) -> None:
        """The value checks `repro run` makes when it loads (`_Reader.read`), on every float
        tensor among `names` (int8 weights hold no value that can be wrong)."""
        for name in names:
            if self.has(name) and self.info(name).dtype in _FLOATS:
                rd.read(name)

    def check_all(self) -> list[str]:
        """Validate every tensor of every layer and the head; returns the problems found (data not
        kept; loadable but suspicious values, such as zero scales, are in `stats.flags`)."""
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
                            self._check_values(rd, [spec.name])
                        else:
                            expected.update(spec.names())
                            sc = self._check_q(rd, spec)
                            self._check_values(rd, [spec.weight, spec.scale])
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
