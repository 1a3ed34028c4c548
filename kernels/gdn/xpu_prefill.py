"""The non-spec group of `xpu_semantics` when the launch has prefills: vllm-xpu-kernels' XE2 path
(`gdn_attn_interface.cpp: causal_conv1d_non_spec` / `gated_delta_rule_non_spec` under
`VLLM_XPU_ENABLE_XE2`, which the 0.1.16.2 wheel is built with: its `_xpu_C` holds the XE2 conv
kernels). Rules 4 and 5 of `xpu_rules.py`; read on the host, so it runs only where a call runs
eagerly: a step with a prefill is never replayed in a graph (a FULL graph holds decode metadata).

Kernels: `xe_2/chunk_causal_conv1d_xe2.hpp` (fewer than 8 tokens) or
`xe_2/chunk_causal_conv1d_tiled_xe2.hpp` (8 and more: it drops a token past every row's end), then
`chunk_update_states_kernel` for every row whose length is not 1, then
`xe_2/chunk_gated_delta_rule_kernels_xe2.hpp` over every row (chunks of 64; a chunk's outputs are
written from its first token's position on)."""
from __future__ import annotations

import torch

from kernels.gdn.common import prepare_qk
from kernels.gdn.core import split_qkv
from kernels.gdn.reference import chunked_gated_delta_rule

PAD = -1  # the conv stages' `pad_slot_id` (gdn_attn_interface.cpp)
XE2_CHUNK, XE2_TILE = 64, 8  # gdn_attn_utils.h: chunk_size_xe2; chunk_causal_conv1d_tiled_xe2.hpp: conv1d_tile_size


class Launch:
    """One kernel launch's view of a state cache, on the host: reads see the cache as the launch
    found it, writes land when it ends (`commit`); two work-items racing on a block are refused
    (`races`), except on the null block, where the last writer in row and token order is kept."""

    def __init__(self, cache: torch.Tensor, name: str, null: int | None, refuse):
        self.cache, self.name, self.null, self.refuse = cache, name, null, refuse
        self.reads: list[tuple[int, str]] = []
        self.writes: dict[int, dict] = {}  # slot -> {writer: its last value}, writers in first-write order

    def slot(self, slot: int, who) -> int:
        if not 0 <= slot < self.cache.shape[0]:
            self.refuse(f"{self.name}: {who} addresses block {slot}, outside the cache of {self.cache.shape[0]} "
                        "(out of bounds: what that touches on a device is unknown)")
        return slot

    def read(self, slot: int, who) -> torch.Tensor:
        self.reads.append((self.slot(slot, who), who))
        return self.cache[slot]

    def write(self, slot: int, value: torch.Tensor, who, columns: int | None = None) -> None:
        """`value` into block `slot`; with `columns`, only its first `columns` columns (a conv window
        of K-1 in a row that may be wider)."""
        self.slot(slot, who)
        if columns is not None:
            value = torch.cat([value.to(self.cache.dtype), self.cache[slot][..., columns:]], dim=-1)
        self.writes.setdefault(slot, {})[who] = value.to(self.cache.dtype)

    def commit(self) -> None:
        slots = [s for s, by in self.writes.items() for _ in by]
        writers = [w for by in self.writes.values() for w in by]
        values = [v for by in self.writes.values() for v in by.values()]
        races(self.name, slots, values, writers, self.reads, self.cache, self.null, self.refuse)
        for slot, by in self.writes.items():
            self.cache[slot] = list(by.values())[-1]


def races(name, slots, values, writers, reads, cache, null, refuse) -> None:
    """Refuse a launch in which work-items race on a block other than the null one: writers leaving
    different bytes, or a block one reads that another changes. `values[i]`: what writer i leaves in
    block `slots[i]` (whole row); `reads`: (block, reader); `cache`: as the launch found it."""
    by: dict[int, dict] = {}
    for i, (s, w) in enumerate(zip(slots, writers)):
        by.setdefault(s, {})[w] = i
    for s, ws in by.items():
        if s == null:
            continue
        final = values[list(ws.values())[-1]]
        clash = any(not torch.equal(values[i], final) for i in ws.values())
        readers = {r for b, r in reads if b == s and set(ws) != {r}} if not torch.equal(final, cache[s]) else set()
        if clash or readers:
            also = f", which {', '.join(map(str, sorted(readers, key=str)))} reads" if readers else ""
            refuse(f"{name}: {', '.join(map(str, ws))} write block {s}{also}, in one launch: the device's order "
                   "decides its bytes")


def _ints(t) -> list[int]:
    return [int(x) for x in t.reshape(-1).tolist()]


def prefill_group(L, out, rows: int, ntok: int, has_init, qsl, glob: list[int], idx, refuse) -> None:
    """The XE2 non-spec launches (module docstring) over `rows` rows and `ntok` tokens (`glob`: their
    positions in the inputs). `L`: `xpu_semantics.Layer`."""
    starts, index = _ints(qsl), _ints(idx)
    if has_init is None:
        refuse("prefills without has_initial_state: the XE2 chunk kernel reads has_initial_state[row] through a "
               "null pointer")
    has = [bool(h) for h in has_init.tolist()]
    ys, last = _conv_launch(L, rows, ntok, has, starts, glob, index, refuse)
    _update_states_launch(L, rows, starts, index, last, refuse)
    _recurrence_launch(L, out, rows, ntok, has, starts, glob, index, ys, refuse)


def _conv_launch(L, rows: int, ntok: int, has: list[bool], starts: list[int], glob: list[int], index: list[int],
                 refuse) -> tuple[dict, dict]:
    """The conv kernel over every token: ({token: its conv output}, {row: the conv window its last token
    leaves, for `chunk_update_states_kernel`}); one-token rows (and a token past every row's end)
    write their window in place."""
    conv, K = Launch(L.conv, "chunk_causal_conv1d_xe2", L.null, refuse), L.K
    ys, last = {}, {}
    for t in range(ntok):
        row = next((i for i in range(rows) if t < starts[i + 1]), None)
        if row is None and ntok >= XE2_TILE:
            continue  # the tiled kernel finds no row for it
        row, start, end = (rows - 1, 0, 0) if row is None else (row, starts[row], starts[row + 1])
        if index[row] == PAD:
            continue
        who = f"non-spec token {t} (row {row})"
        nin = min(t - start + 1, K)
        state = conv.read(index[row], who)[:, K - 1 - (K - nin):K - 1] if nin < K and has[row] else \
            torch.zeros(L.qkv.shape[1], K - nin, dtype=L.conv.dtype, device=L.conv.device)
        seq = torch.cat([state.to(L.qkv.dtype)] + [L.x(glob[u], who)[:, None] for u in range(t - nin + 1, t + 1)], 1)
        ys[t] = L.conv_out(seq[:, :K - 1], seq[:, K - 1])
        if end - start > 1:
            if t == end - 1:
                last[row] = seq[:, 1:]
        else:  # a one-token row, or a token past every row's end: in place
            conv.write(index[row], seq[:, 1:], who, columns=K - 1)
    conv.commit()
    return ys, last


def _update_states_launch(L, rows: int, starts: list[int], index: list[int], last: dict, refuse) -> None:
    """`chunk_update_states_kernel`: every row longer than one token writes its last conv window."""
    update = Launch(L.conv, "chunk_update_states_kernel", L.null, refuse)
    for row in range(rows):
        length = starts[row + 1] - starts[row]
        if length == 1:
            continue
        if length == 0 or index[row] == PAD:
            refuse(f"row {row} ({length} tokens, block {index[row]}): chunk_update_states_kernel writes a buffer the "
                   "conv launch never filled for it into its block, unchecked: unknown")
        update.write(index[row], last[row], f"row {row}", columns=L.K - 1)
    update.commit()


def _recurrence_launch(L, out, rows: int, ntok: int, has: list[bool], starts: list[int], glob: list[int],
                       index: list[int], ys: dict, refuse) -> None:
    """The XE2 chunked gated delta rule over every row: outputs into `out`, the final state into the row's
    block."""
    rec = Launch(L.ssm, "chunk_gated_delta_rule_xe2", L.null, refuse)
    Hk, dk, Hv, dv = L.dims
    for row in range(rows):
        start, end, who = starts[row], starts[row + 1], f"non-spec row {row}"
        if end <= start:
            continue  # no chunk: no state touched
        if index[row] == PAD:
            refuse(f"{who}: chunk_gated_delta_rule_xe2 reads and writes ssm_state[-1] (no index check): outside the "
                   "cache, unknown")
        if end > ntok:
            refuse(f"{who} ends at token {end}, past the {ntok} the conv launch wrote")
        S = rec.read(index[row], who).float() if has[row] else \
            torch.zeros(L.ssm.shape[1:], dtype=torch.float32, device=L.ssm.device)
        q, k, v = split_qkv(torch.stack([ys[t] for t in range(start, end)]), Hk, dk, Hv, dv)
        qf, kf = prepare_qk(q, k, Hv)
        at = torch.tensor(glob[start:end], device=L.g.device)
        o, S = chunked_gated_delta_rule(qf, kf, v.float(), L.g.index_select(0, at), L.beta.index_select(0, at), S,
                                        XE2_CHUNK)
        for c0 in range(0, end - start, XE2_CHUNK):
            base, m = glob[start + c0], min(XE2_CHUNK, end - start - c0)
            if not (0 <= base and base + m <= out.shape[0]):
                refuse(f"{who} writes output rows {base}..{base + m - 1}, outside core_attn_out's {out.shape[0]}")
            out[base:base + m] = o[c0:c0 + m].to(out.dtype)
        rec.write(index[row], S, who)
    rec.commit()
