"""The bandwidth floor of `repro bench`: the bytes of weights and state one step must move at
least once (every weight it uses, read once; for the MoE only the experts the batch was routed
to; the state rows of the batch, read and written). Divided by the copy bandwidth measured in the
same run, it is the time no kernel can beat."""
from __future__ import annotations

import torch

from ..errors import BadInput
from kernels.moe.common import router_probs
from kernels.moe.vectorized import topk_sorted


def nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def linear_bytes(lin) -> int:
    """A `repro.model.weights.Linear`: its weight and (W8A8) per-channel scale."""
    return nbytes(lin.weight) + nbytes(lin.scale)


def expert_bytes(experts) -> int:
    """Bytes of one routed expert (gate/up, down, their scales)."""
    E = experts.w13.shape[0]
    return sum(nbytes(t) for t in (experts.w13, experts.w13_scale, experts.w2, experts.w2_scale)) // E


def moe_bytes(moe, experts_used: int) -> int:
    """Router + the experts actually used + shared expert and its gate."""
    return (nbytes(moe.gate) + experts_used * expert_bytes(moe.experts) + linear_bytes(moe.shared_gate_up)
            + linear_bytes(moe.shared_down) + nbytes(moe.shared_expert_gate))


def state_row_bytes(cache) -> tuple[int, int]:
    """(conv_state row, ssm_state row) in bytes: what one sequence's decode step reads (and writes)."""
    return nbytes(cache.conv[0]), nbytes(cache.ssm[0])


def floor_bytes(island: str, layer, head, next_norm, cache, batch: int, experts_used: int | None = None) -> int:
    """Bytes of weights and state one decode step of `batch` rows through `island` reads and writes.

    island: submod0 | gdn_core | submod1 | moe | chain. `cache` is a `StateCache` (gdn_core and
    chain); `experts_used` the number of distinct routed experts the batch chose (submod1, moe,
    chain).
    """
    g, m = layer.gdn, layer.moe
    embed_rows = batch * nbytes(head.embed_tokens[0])
    if island == "submod0":
        return (embed_rows + nbytes(layer.input_layernorm)
                + sum(linear_bytes(x) for x in (g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a)))
    if island == "gdn_core":
        conv_row, ssm_row = state_row_bytes(cache)
        weights = nbytes(g.conv1d_weight) + nbytes(g.A_log) + nbytes(g.dt_bias)
        return weights + 2 * batch * (conv_row + ssm_row)  # each row read once and written once
    if island == "submod1":
        return (nbytes(g.norm_weight) + linear_bytes(g.out_proj) + nbytes(layer.post_attention_layernorm)
                + moe_bytes(m, experts_used) + nbytes(next_norm))
    if island == "moe":
        return embed_rows + nbytes(layer.post_attention_layernorm) + moe_bytes(m, experts_used)
    if island == "chain":
        return sum(floor_bytes(i, layer, head, next_norm, cache, batch, experts_used)
                   for i in ("submod0", "gdn_core", "submod1"))
    raise BadInput(f"no floor for island {island!r}")


def routed_experts_used(moe_weights, x: torch.Tensor, top_k: int) -> int:
    """Distinct experts the rows of x (the MoE's input) are routed to, by the ops' routing rule."""
    with torch.inference_mode():
        _, ids = topk_sorted(router_probs(x, moe_weights.gate), top_k)
    return int(ids.unique().numel())


class _MoESpy:
    """Stands in for a MoE block for one eager call and keeps the input it was given."""

    def __init__(self, block):
        self.block, self.x = block, None

    def __call__(self, x):
        self.x = x.detach().clone()
        return self.block(x)
