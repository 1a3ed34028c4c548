"""Small, deterministic sample arguments for every op (opcheck, graph-capture checks, benches).

`sample_args(op, device=..., seed=..., **dims)` returns the positional arguments of
`torch.ops.repro.<op>`. Dims default to tiny shapes with the model's structure (GQA-style
Hk < Hv, conv K = 4, a padded row carrying the sentinel, experts W8A8; `spec_k` draft tokens a
row for the speculative ops).
"""
from __future__ import annotations

import torch

DEFAULTS = dict(T=6, B=4, H=64, K=64, N=24, C=32, conv_k=4, Hk=2, Hv=4, dk=16, dv=16, S=6,
                E=8, I=32, Is=32, top_k=2, sentinel=-1, quantized=True, spec_k=2)


def _g(seed):
    return torch.Generator().manual_seed(seed)


def rand(shape, gen, dtype=torch.bfloat16, device="cpu", scale=1.0):
    return (torch.randn(shape, generator=gen) * scale).to(dtype).to(device)


def int8(shape, gen, device="cpu"):
    return torch.randint(-128, 128, shape, generator=gen, dtype=torch.int8).to(device)


def state_indices(B, S, sentinel, device="cpu"):
    """Distinct live slots (never the sentinel's slot 0 when sentinel is 0), last row padding."""
    first = 1 if sentinel == 0 else 0
    idx = [first + (i * 3) % (S - first) for i in range(B)]
    idx[-1] = sentinel
    return torch.tensor(idx, dtype=torch.int32, device=device)


def sample_args(op: str, device="cpu", seed=0, **dims):
    d = {**DEFAULTS, **dims}
    g = _g(seed)
    dev = dict(device=device)
    if op == "w8a8_linear":
        return (rand((d["T"], d["K"]), g, **dev), int8((d["N"], d["K"]), g, device),
                (torch.rand(d["N"], generator=g) / 64 + 1e-3).to(device), rand((d["N"],), g, **dev))
    if op == "rms_norm":
        return rand((d["T"], d["H"]), g, **dev), rand((d["H"],), g, **dev, scale=0.1), 1e-6
    if op == "add_rms_norm":
        return (rand((d["T"], d["H"]), g, **dev), rand((d["T"], d["H"]), g, **dev), rand((d["H"],), g, **dev, scale=0.1),
                1e-6)
    if op == "rms_norm_gated":
        shape = (d["T"], d["Hv"], d["dv"])
        return (rand(shape, g, torch.float32, **dev), rand(shape, g, **dev),
                rand((d["dv"],), g, **dev, scale=0.1) + 1, 1e-6)
    if op in ("causal_conv1d_fn", "causal_conv1d_update"):
        C, Kc, S, B = d["C"], d["conv_k"], d["S"], d["B"]
        weight = rand((C, Kc), g, **dev, scale=0.5)
        conv_state = rand((S, C, Kc - 1), g, **dev)
        idx = state_indices(B, S, d["sentinel"], device)
        if op == "causal_conv1d_update":
            return rand((B, C), g, **dev), weight, conv_state, idx, d["sentinel"]
        lengths = [(i % 3) + 1 for i in range(B)]                          # 1, 2, 3, 1, ...
        qsl = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0).to(torch.int32).to(device)
        T = sum(lengths)                                                   # no read back from the device
        has = torch.tensor([i % 2 == 0 for i in range(B)], device=device)
        return rand((T, C), g, **dev), weight, conv_state, qsl, idx, has, d["sentinel"]
    if op in ("causal_conv1d_update_spec", "gated_delta_rule_spec"):
        return _spec_args(op, g, device, d, S_given="S" in dims)
    if op == "gdn_gating":
        Hv, T = d["Hv"], d["T"]
        return (rand((Hv,), g, **dev), rand((T, Hv), g, **dev), rand((Hv,), g, **dev), rand((T, Hv), g, **dev))
    if op in ("gated_delta_rule_decode", "gated_delta_rule_prefill"):
        Hk, Hv, dk, dv, S, B = d["Hk"], d["Hv"], d["dk"], d["dv"], d["S"], d["B"]
        ssm_state = rand((S, Hv, dk, dv), g, torch.float32, **dev, scale=0.1)
        idx = state_indices(B, S, d["sentinel"], device)
        if op == "gated_delta_rule_decode":
            T = B
        else:
            lengths = [(i % 3) * 3 + 2 for i in range(B)]
            qsl = torch.tensor([0] + lengths).cumsum(0).to(torch.int32).to(device)
            T = sum(lengths)
        q, k = rand((T, Hk, dk), g, **dev), rand((T, Hk, dk), g, **dev)
        v = rand((T, Hv, dv), g, **dev)
        gate = -torch.rand(T, Hv, generator=g).to(device)
        beta = torch.rand(T, Hv, generator=g).to(device)
        if op == "gated_delta_rule_decode":
            return q, k, v, gate, beta, ssm_state, idx, d["sentinel"]
        has = torch.tensor([i % 2 == 1 for i in range(B)], device=device)
        return q, k, v, gate, beta, ssm_state, qsl, idx, has, d["sentinel"]
    if op == "moe":
        return moe_args(g, device=device, **{k: d[k] for k in ("T", "H", "E", "I", "Is", "top_k", "quantized")})
    if op == "gdn_attention":  # two decodes and two padded rows on the null block, as a FULL replay pads
        return gdn_core_args(device, seed, T=4, S=d["S"], Hk=d["Hk"], Hv=d["Hv"], dk=d["dk"], dv=d["dv"],
                             num_decodes=4, num_actual_tokens=4, num_decode_tokens=4,
                             non_spec_query_start_loc=[0, 1, 2, 2, 2], non_spec_state_indices=[3, 5, 0, 0])
    raise ValueError(f"no sample for op {op!r}")


GDN_META = ("num_prefills", "num_decodes", "num_spec_decodes", "num_actual_tokens", "num_decode_tokens",
            "num_prefill_tokens", "has_initial_state", "non_spec_query_start_loc", "non_spec_token_indx",
            "non_spec_state_indices", "spec_query_start_loc", "spec_token_indx", "spec_state_indices",
            "num_accepted_tokens", "sentinel")


def gdn_core_args(device="cpu", seed=0, *, T=4, S=8, Hk=2, Hv=4, dk=16, dv=16, conv_k=4, spec_k=0, **meta):
    """`repro::gdn_attention`'s arguments: a layer's inputs for T tokens and a cache of S blocks (conv
    rows K-1+spec_k wide), then the metadata (`GDN_META`, by name: counts 0, tensors None and
    sentinel 0 unless given; lists become int32 tensors, token maps int64, has_initial_state bool)."""
    g = _g(seed)
    dev = dict(device=device)
    C = 2 * Hk * dk + Hv * dv
    layer = (torch.zeros(T, Hv, dv, dtype=torch.bfloat16, device=device), rand((T, C), g, **dev),
             rand((T, Hv), g, **dev), rand((T, Hv), g, **dev), rand((C, conv_k), g, **dev, scale=0.5),
             rand((Hv,), g, **dev), rand((Hv,), g, **dev), rand((S, C, conv_k - 1 + spec_k), g, **dev),
             rand((S, Hv, dk, dv), g, torch.float32, **dev, scale=0.1))
    unknown = set(meta) - set(GDN_META)
    if unknown:
        raise ValueError(f"gdn_core_args: no metadata field {sorted(unknown)}")
    kinds = {"has_initial_state": torch.bool, "non_spec_token_indx": torch.long, "spec_token_indx": torch.long}
    out = []
    for name in GDN_META:
        v = meta.get(name, 0 if name in GDN_META[:6] + ("sentinel",) else None)
        if isinstance(v, (list, tuple)):
            v = torch.tensor(v, dtype=kinds.get(name, torch.int32), device=device)
        out.append(v)
    return layer + tuple(out)


def _spec_args(op, g, device, d, S_given):
    """Rows of n = 1 + spec_k, n - 1, ... tokens with 1..n accepted, the last row padding (no
    tokens, the sentinel, one accepted: how vLLM pads), one token after the last row."""
    B, n, sentinel = d["B"], d["spec_k"] + 1, d["sentinel"]
    lengths = [n - i % n for i in range(B - 1)] + [0]
    accepted = [1 + (i + 1) % n for i in range(B - 1)] + [1]
    qsl = torch.tensor([0] + lengths).cumsum(0).to(torch.int32).to(device)
    T = sum(lengths) + 1
    acc = torch.tensor(accepted, dtype=torch.int32, device=device)
    dev = dict(device=device)
    if op == "causal_conv1d_update_spec":
        C, Kc, S = d["C"], d["conv_k"], d["S"]
        weight = rand((C, Kc), g, **dev, scale=0.5)
        conv_state = rand((S, C, Kc - 1 + n - 1), g, **dev)
        return rand((T, C), g, **dev), weight, conv_state, state_indices(B, S, sentinel, device), acc, qsl, sentinel
    Hk, Hv, dk, dv = d["Hk"], d["Hv"], d["dk"], d["dv"]
    first = 1 if sentinel == 0 else 0
    S = d["S"] if S_given else B * n + first                            # distinct slots unless S is given
    idx = [[first + (i * n + j) % (S - first) for j in range(n)] for i in range(B - 1)] + [[sentinel] * n]
    ssm_state = rand((S, Hv, dk, dv), g, torch.float32, **dev, scale=0.1)
    q, k = rand((T, Hk, dk), g, **dev), rand((T, Hk, dk), g, **dev)
    v = rand((T, Hv, dv), g, **dev)
    gate = -torch.rand(T, Hv, generator=g).to(device)
    beta = torch.rand(T, Hv, generator=g).to(device)
    return (q, k, v, gate, beta, ssm_state, torch.tensor(idx, dtype=torch.int32, device=device), acc, qsl, sentinel)


def moe_args(g, *, T, H, E, I, Is, top_k, quantized, device="cpu", renormalize=True):
    dev = dict(device=device)

    def weight(shape):
        if quantized:
            return int8(shape, g, device), (torch.rand(shape[:-1], generator=g) / 256 + 1e-4).to(device)
        return rand(shape, g, **dev, scale=shape[-1] ** -0.5), None

    w13, s13 = weight((E, 2 * I, H))
    w2, s2 = weight((E, H, I))
    sw13, ss13 = weight((2 * Is, H))
    sw2, ss2 = weight((H, Is))
    return (rand((T, H), g, **dev), rand((E, H), g, **dev, scale=0.2), w13, s13, w2, s2, sw13, ss13,
            sw2, ss2, rand((1, H), g, **dev, scale=0.2), top_k, renormalize)


def draw_layout(draw, *, max_batch=5, max_len=6, max_slots=6, duplicates=True, pad_tokens=True):
    """Draw a batch composition with Hypothesis' `draw` (e.g. `data.draw`).

    Returns dict: sentinel (-1 or 0), S (cache rows), indices (per request; sentinel = padding),
    lengths (tokens per request, 0 allowed), has_initial (per request), pad (tokens after the
    last request). Live indices are distinct unless `duplicates` draws a stale repeat.
    """
    from hypothesis import strategies as st

    sentinel = draw(st.sampled_from([-1, 0]))
    S = draw(st.integers(2, max_slots))
    live = list(range(1 if sentinel == 0 else 0, S))
    B = draw(st.integers(1, max_batch))
    order = draw(st.permutations(live))
    indices = []
    for b in range(B):
        kind = draw(st.sampled_from(["live", "live", "sentinel"] + (["repeat"] if duplicates else [])))
        if kind == "sentinel" or (kind == "live" and b >= len(order)):
            indices.append(sentinel)
        elif kind == "repeat":
            indices.append(draw(st.sampled_from(live)))
        else:
            indices.append(order[b])
    return dict(sentinel=sentinel, S=S, indices=indices,
                lengths=[draw(st.integers(0, max_len)) for _ in range(B)],
                has_initial=[draw(st.booleans()) for _ in range(B)],
                pad=draw(st.integers(0, 2)) if pad_tokens else 0)


def layout_tensors(layout, device="cpu"):
    """(query_start_loc int32 [B+1], state_indices int32 [B], has_initial_state bool [B], T)."""
    qsl = torch.tensor([0] + layout["lengths"]).cumsum(0).to(torch.int32)
    T = int(qsl[-1]) + layout["pad"]
    return (qsl.to(device), torch.tensor(layout["indices"], dtype=torch.int32, device=device),
            torch.tensor(layout["has_initial"], dtype=torch.bool, device=device), T)
