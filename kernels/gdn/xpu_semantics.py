"""`xpu_semantics` provider of `repro::gdn_attention`: what vllm-xpu-kernels' `_xpu_C.gdn_attention`
does with each row, token and state index, in plain torch on any device. The arithmetic is this
suite's (the reference conv taps and chunked prefill, the `torch` provider's decode step); the SYCL
kernels reduce in another order, so on a B70 the bits differ, and the row, token and block rules do
not.

The rules, each with the source file and function it was read from, and the cases the sources leave
unknown (refused in one line, `KernelRefused`, rather than guessed): `xpu_rules.py`. Reads see a
cache as the launch found it; a launch's writes land at its end.

Decode and spec launches are written on the device (no host read: a FULL graph holds them, as it
held the XPU kernels before vLLM #51928 moved the core out of the graph), so the checks run where
the call runs eagerly (every eager step, and the warm-up before each capture); a replay re-runs the
recorded work unchecked, an index then taken modulo the cache's rows (the suite's own kernels'
rule, `kernels/_state.py`) and a race resolved as on the null block. Launches with prefills read
the metadata on the host (`xpu_prefill.py`): they never run in a graph.
"""
from __future__ import annotations

import torch

from kernels._state import scatter_last_wins
from kernels.conv1d.common import conv_taps, weight_2d
from kernels.errors import KernelRefused
from kernels.gdn.common import prepare_qk
from kernels.gdn.core import head_dims, split_qkv
from kernels.gdn.reference import gdn_gating_reference
from kernels.gdn.vectorized import decode_step
from kernels.gdn.xpu_prefill import PAD, prefill_group, races


def refuse(what: str) -> None:
    raise KernelRefused(f"gdn_attention (xpu_semantics): {what}")


def check(ok: bool, what: str) -> None:
    """A check the kernel itself makes (TORCH_CHECK), quoted."""
    if not ok:
        refuse(f"the kernel refuses this call: {what}")


def host_reads(t: torch.Tensor) -> bool:
    """Whether the call may read its metadata on the host: not while a capture records the ops below
    this one (a TorchDispatchMode: the CPU tape) nor inside a CUDA graph capture."""
    return not torch._C._len_torch_dispatch_stack() and not (t.is_cuda and torch.cuda.is_current_stream_capturing())


class Layer:
    """The call's inputs and the per-token arithmetic: the `reference` conv taps, the `torch`
    provider's decode step (its sums are batch-invariant, so a padded replay's live rows equal the
    exact-shape eager step bit for bit)."""

    def __init__(self, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state, sentinel: int):
        self.qkv, self.conv, self.ssm = qkv, conv_state, ssm_state
        self.w = weight_2d(conv_weight)
        self.K = self.w.shape[1]
        self.dims = head_dims(qkv, ssm_state)
        self.g, self.beta = gdn_gating_reference(A_log, a, dt_bias, b)  # every row at once: one shape
        self.null = 0 if sentinel == 0 else None

    def x(self, t: int, who) -> torch.Tensor:
        if not 0 <= t < self.qkv.shape[0]:
            refuse(f"{who} reads input token {t}, outside the {self.qkv.shape[0]} rows given")
        return self.qkv[t]

    def take(self, rows: torch.Tensor) -> torch.Tensor:
        """Input rows by position (wrapped: only an unchecked replay can ask for one outside)."""
        return self.qkv.index_select(0, torch.remainder(rows, self.qkv.shape[0]))

    def blocks(self, cache: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return cache.index_select(0, torch.remainder(slots, cache.shape[0]))

    def conv_out(self, window: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """window [..., C, K-1] (oldest first), x [..., C] -> the token's conv output in x's dtype."""
        taps = [window[..., j].float() for j in range(self.K - 1)] + [x.float()]
        return conv_taps(taps, self.w).to(x.dtype)

    def prepared(self, y: torch.Tensor):
        """Conv outputs [N, C] -> qf, kf [N, Hv, dk] (normalised, expanded), v [N, Hv, dv]."""
        Hk, dk, Hv, dv = self.dims
        q, k, v = split_qkv(y, Hk, dk, Hv, dv)
        qf, kf = prepare_qk(q, k, Hv)
        return qf, kf, v

    def land(self, cache, slots, valid, new, columns: int | None = None) -> None:
        """A launch's writes, in the order given (the last of several on one block wins), each the whole
        block (with `columns`: its first `columns` columns, the rest as they were)."""
        slots = torch.remainder(slots, cache.shape[0])
        old = cache.index_select(0, slots)
        if columns is not None:
            new = torch.cat([new.to(cache.dtype), old[..., columns:]], dim=-1)
        scatter_last_wins(cache, slots, valid, new, old)

    def guard(self, name, cache, slots, valid, new, writers, reads, columns=None) -> None:
        """Eager only: every block in the cache, and no race off the null block (`xpu_prefill.races`)."""
        s = [int(x) for x in slots.tolist()]
        ok = [i for i, v in enumerate(valid.tolist()) if v]
        bad = [x for x in [s[i] for i in ok] + [b for b, _ in reads] if not 0 <= x < cache.shape[0]]
        if bad:
            refuse(f"{name} addresses block {bad[0]}, outside the cache of {cache.shape[0]} (out of bounds: what "
                   "that touches on a device is unknown)")
        old = cache.index_select(0, slots[ok]) if ok else None
        full = [torch.cat([new[i].to(cache.dtype), old[j][..., columns:]], -1) if columns else new[i]
                for j, i in enumerate(ok)]
        races(name, [s[i] for i in ok], full, [writers[i] for i in ok], reads, cache, self.null, refuse)


def spec_group(L: Layer, out, ns: int, qsl, token_indx, idx, accepted, checked: bool) -> None:
    """Rules 1, 3 and 7 (`xpu_rules.py`): the spec conv launch, then the spec recurrence launch, rows batched."""
    check(idx is not None and idx.dim() == 2 and idx.shape[0] == ns, "spec_state_indices_tensor must have size "
          "[num_spec_decodes, num_speculative_tokens + 1] (causal_conv1d_spec)")
    n1, K, C = idx.shape[1], L.K, L.qkv.shape[1]
    check(qsl is not None and qsl.shape == (ns + 1,), "spec_query_start_loc must have size [num_spec_decodes + 1]")
    check(accepted is not None and accepted.shape == (ns,), "num_accepted_tokens size must be num_spec_decodes")
    check(token_indx.shape[0] == ns * n1, f"spec_token == num_spec_decodes * (num_speculative_tokens + 1): "
          f"{token_indx.shape[0]} spec tokens for {ns} rows of {n1} (causal_conv1d_spec)")
    flat = idx.reshape(-1).long()
    at = torch.arange(ns, device=flat.device) * n1 + (accepted.long() - 1).clamp(min=0)
    init = flat.index_select(0, at.clamp(max=ns * n1 - 1))
    g = token_indx.long().reshape(ns, n1)
    if checked:
        acc, pos = accepted.tolist(), g.reshape(-1).tolist()
        if int(at.max()) >= ns * n1:
            refuse(f"spec row {acc.index(max(acc))}: num_accepted_tokens {max(acc)} reads past the index tensor")
        if PAD in flat.tolist():
            refuse("a spec column of -1: gated_delta_rule_spec_kernel reads or writes ssm_state[-1] (no index "
                   "check): outside the cache, unknown")
        if not all(0 <= p < min(L.qkv.shape[0], out.shape[0]) for p in pos):
            refuse(f"spec tokens at {pos}: outside the {L.qkv.shape[0]} input rows")
    window = torch.where((init == PAD)[:, None, None], 0, L.blocks(L.conv, init)[:, :, :K - 1])
    ys, windows = [], []
    for t in range(n1):
        x = L.take(g[:, t])
        ys.append(L.conv_out(window, x))
        window = torch.cat([window[:, :, 1:], x[:, :, None].to(window.dtype)], dim=2)
        windows.append(window)
    wins = torch.stack(windows, 1).reshape(ns * n1, C, K - 1)                  # (row, column) order
    if checked:
        L.guard("causal_conv1d_spec_kernel", L.conv, flat, flat != PAD, wins, [f"spec row {i // n1}" for i in
                range(ns * n1)], [(int(s), f"spec row {r}") for r, s in enumerate(init.tolist()) if s != PAD], K - 1)
    L.land(L.conv, flat, flat != PAD, wins, K - 1)
    qf, kf, v = L.prepared(torch.stack(ys, 1).reshape(ns * n1, C))
    pos = torch.remainder(g.reshape(-1), L.g.shape[0])
    gg, bb = L.g.index_select(0, pos), L.beta.index_select(0, pos)
    S, states = L.blocks(L.ssm, init).float(), []
    for t in range(n1):
        i = torch.arange(ns, device=flat.device) * n1 + t
        o, S = decode_step(*(z.index_select(0, i) for z in (qf, kf, v, gg, bb)), S)
        out.index_copy_(0, torch.remainder(g[:, t], out.shape[0]), o.to(out.dtype))
        states.append(S)
    new = torch.stack(states, 1).reshape(ns * n1, *L.ssm.shape[1:])
    if checked:
        L.guard("gated_delta_rule_spec_kernel", L.ssm, flat, torch.ones_like(flat, dtype=torch.bool), new,
                [f"spec row {i // n1}" for i in range(ns * n1)], [(int(s), f"spec row {r}")
                                                                  for r, s in enumerate(init.tolist())])
    L.land(L.ssm, flat, torch.ones_like(flat, dtype=torch.bool), new)


def decode_group(L: Layer, out, decodes: int, ntok: int, has_init, qsl, glob, idx, checked: bool) -> None:
    """Rules 3, 4 and 6 (`xpu_rules.py`), without prefills: the conv launch over `ntok` tokens, then the recurrence over rows
    0..decodes-1 (`glob`: the tokens' positions in the inputs)."""
    R, K, C = qsl.shape[0] - 1, L.K, L.qkv.shape[1]
    qs, ix, dev = qsl.long(), idx.long(), qsl.device
    tt = torch.arange(ntok, device=dev)
    row = torch.searchsorted(qs[1:].contiguous(), tt, right=True)
    stray = row >= R                                                            # rule 4: the last row's, from 0
    row = row.clamp(max=R - 1)
    start = torch.where(stray, 0, qs.index_select(0, row))
    end = torch.where(stray, 0, qs.index_select(0, row + 1))
    slot = ix.index_select(0, row)
    load = torch.ones(R, dtype=torch.bool, device=dev) if has_init is None else has_init.bool()
    nst = (K - (tt - start + 1)).clamp(min=0)                                   # state columns before the inputs
    state = L.blocks(L.conv, slot)
    cols = []
    for j in range(K):
        sv = state.gather(2, (K - 1 - nst + j).clamp(0, K - 2)[:, None, None].expand(ntok, C, 1))[:, :, 0]
        sv = torch.where(load.index_select(0, row)[:, None], sv, 0)
        xv = L.take(glob.index_select(0, (tt - (K - 1) + j).clamp(min=0)))
        cols.append(torch.where((j < nst)[:, None], sv.to(xv.dtype), xv))
    seq = torch.stack(cols, 2)                                                  # [ntok, C, K], oldest first
    y = L.conv_out(seq[:, :, :K - 1], seq[:, :, K - 1])
    inplace = (end - start <= 1) & (slot != PAD)                                # longer rows: no update launch
    if checked:
        bad = [r for r, s in enumerate(ix[:decodes].tolist()) if s == PAD]
        if bad:
            refuse(f"non-spec row {bad[0]} (of the {decodes} decode rows): gated_delta_rule_kernel reads and writes "
                   "ssm_state[-1] (no index check): outside the cache, unknown")
        if int(qs[decodes]) > ntok:
            refuse(f"decode rows end at token {int(qs[decodes])}, past the {ntok} the conv launch wrote")
        reads = [(int(s), f"token {t}") for t, (s, n, ld, p) in enumerate(zip(
            slot.tolist(), nst.tolist(), load.index_select(0, row).tolist(), (slot == PAD).tolist())) if n and ld and not p]
        L.guard("causal_conv1d_kernel", L.conv, slot, inplace, seq[:, :, 1:], [f"token {t}" for t in range(ntok)],
                reads, K - 1)
    L.land(L.conv, slot, inplace, seq[:, :, 1:], K - 1)
    qf, kf, v = L.prepared(y)
    rs, r0, r1 = ix[:decodes], qs[:decodes], qs[1:decodes + 1]
    S = torch.where(load[:decodes, None, None, None], L.blocks(L.ssm, rs), 0).float()
    longest = int((r1 - r0).max()) if checked and decodes else ntok             # a replay steps every position
    spare = torch.zeros(1, *out.shape[1:], dtype=out.dtype, device=out.device)
    ext = torch.cat([out, spare])                                               # row T: where idle rows write
    for j in range(longest):
        t = r0 + j
        live = t < r1
        tc = t.clamp(0, ntok - 1)
        at = torch.remainder(glob.index_select(0, tc), L.g.shape[0])
        o, S2 = decode_step(qf.index_select(0, tc), kf.index_select(0, tc), v.index_select(0, tc),
                            L.g.index_select(0, at), L.beta.index_select(0, at), S)
        S = torch.where(live[:, None, None, None], S2, S)
        ext.index_copy_(0, torch.where(live, torch.remainder(at, out.shape[0]), out.shape[0]), o.to(out.dtype))
    out.copy_(ext[:out.shape[0]])
    every = torch.ones(decodes, dtype=torch.bool, device=dev)
    if checked:
        L.guard("gated_delta_rule_kernel", L.ssm, rs, every, S, [f"decode row {r}" for r in range(decodes)],
                [(int(s), f"decode row {r}") for r, (s, ld) in enumerate(zip(rs.tolist(), load.tolist())) if ld])
    L.land(L.ssm, rs, every, S)


def gdn_attention_xpu_semantics(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state,
                                num_prefills, num_decodes, num_spec_decodes, num_actual_tokens, num_decode_tokens,
                                num_prefill_tokens, has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
                                non_spec_state_indices, spec_query_start_loc, spec_token_indx, spec_state_indices,
                                num_accepted_tokens, sentinel) -> None:
    """Module docstring. `num_decode_tokens`, `num_prefill_tokens`: not the kernel's (it counts by
    query start locations); `sentinel`: which block is the null one (0) for the race rule only."""
    n, checked = num_actual_tokens, host_reads(core_out)
    check(min(core_out.shape[0], qkv.shape[0], b.shape[0]) >= n, "core_attn_out, projected_states_qkvz and "
          "projected_states_ba must each have size(0) >= num_actual_tokens")
    L = Layer(qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state, sentinel)
    if num_spec_decodes > 0:
        if spec_token_indx is None:
            refuse("spec rows without spec_token_indx: gdn_attention dereferences it")
        if spec_token_indx.shape[0] > 0:
            spec_group(L, core_out, num_spec_decodes, spec_query_start_loc, spec_token_indx, spec_state_indices,
                       num_accepted_tokens, checked)
    rows = num_prefills + num_decodes
    if rows > 0:
        qsl, idx = non_spec_query_start_loc, non_spec_state_indices
        check(qsl is not None and qsl.shape == (rows + 1,),
              "non_spec_query_start_loc must have size [num_prefills + num_decodes + 1] (causal_conv1d_non_spec)")
        check(idx is not None and idx.shape == (rows,),
              "non_spec_state_indices_tensor must have size [num_prefills + num_decodes] (causal_conv1d_non_spec)")
        check(has_initial_state is None or has_initial_state.shape == (rows,),
              "has_initial_state must have size [num_prefills + num_decodes] (causal_conv1d_non_spec)")
        ntok = n if non_spec_token_indx is None else non_spec_token_indx.shape[0]
        if ntok <= 0:  # gdn_attention runs the group only with tokens
            return
        glob = torch.arange(ntok, device=qkv.device) if non_spec_token_indx is None else non_spec_token_indx.long()
        if num_prefills:
            if not checked:
                refuse("a launch with prefills reads its metadata on the host: it cannot be captured")
            prefill_group(L, core_out, rows, ntok, has_initial_state, qsl, [int(t) for t in glob.tolist()], idx,
                          refuse)
        else:
            decode_group(L, core_out, num_decodes, ntok, has_initial_state, qsl, glob, idx, checked)
