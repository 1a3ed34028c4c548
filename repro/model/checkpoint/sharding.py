"""Loading a layer sharded for one TP rank (only the shard's bytes are read), the head, and the
inverse: TP shards merged back into the full layer (what the tests hold the sharding against).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ..config import GDN
from ...errors import CheckpointError
from ..quant import BF16
from ..weights import Experts, GDNWeights, HeadWeights, LayerWeights, Linear, MoEWeights
from .files import Ranges, _Reader, _row_runs
from .layout import Param, QTensor, Spec, deinterleave_ba, deinterleave_qkvz


class _Loading:
    """`Checkpoint`'s loaders (a mixin: it needs `config`, `info`, `layout`, the specs and checks)."""

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
        I, Is = c.moe_intermediate_size, c.shared_expert_intermediate_size
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
                           None if ms[0].shared_down.scale is None
                           else _same((m.shared_down.scale for m in ms), "shared down scale")),
        shared_expert_gate=_same((m.shared_expert_gate for m in ms), "mlp.shared_expert_gate.weight"),
    )
    return LayerWeights(
        index=w0.index, layer_type=w0.layer_type,
        input_layernorm=_same((w.input_layernorm for w in shards), "input_layernorm.weight"),
        post_attention_layernorm=_same((w.post_attention_layernorm for w in shards), "post_attention_layernorm.weight"),
        moe=moe, gdn=gdn, tp_rank=0, tp_size=1)
