"""Which kind of difference is it? The oracle behind a lockstep mismatch.

Replay == eager bit for bit holds for batch-invariant, deterministic kernels (ours). Production
kernels (FLA's Triton GDN, vllm-xpu-kernels) may round differently at another row count, or
differ from call to call. So when eager and replay differ at a step, the step is run again, from
the eager copy's state as it was before the step, on a third copy of the islands (the probe):

- twice at the exact shape, and twice at the padded shape the replay ran at;
- exact != exact, or padded != padded: the same eager call on identical inputs gave different
  results: **nondeterminism**, provided the replay's difference stays within the noise the
  kernel itself just showed (`NOISE_FACTOR`) and the calibrated bound;
- otherwise replay must equal the padded eager run bit for bit, outputs and the *whole* state
  (graph semantics have no rounding excuse): if not, a **graph hazard**;
- if it does, the difference is exact-shape vs padded-shape eager: **batch variance** when
  within the calibrated bound, else **corruption**.

Corruption also covers a non-finite value in one copy only and a changed canary token
(`head.token_ids`), whatever else holds. Graph hazards and corruption fail a case; batch variance
and nondeterminism are findings (failures only in strict mode). After a finding the lockstep
resyncs the eager copy's state to the replay's (proved equal to the padded eager run, or within
the kernel's own noise), so later steps are judged afresh and planted hazards stay detectable.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from .compare import (block_owner, BATCH_VARIANCE, CORRUPTION, GRAPH_HAZARD, NONDETERMINISM, Divergence, compare_outputs,
                      first_row, magnitude, max_abs, nonfinite_side, ordered, row_owner, same, summaries)

# ---- calibrated bounds ----------------------------------------------------------------------
# Every float tensor the chain compares is computed from bf16 activations (embedding rows, bf16
# GEMM outputs, int8 activations requantised per token: one int8 level at the row maximum is
# 1/127 of it, about one bf16 ulp). So rounding noise is counted in bf16 ulps of the tensor's
# own magnitude, whatever it is stored in: the fp32 ssm state is updated from bf16 q/k/v, and its
# noise is bf16-sized, not fp32-sized. Finer dtypes never give a smaller eps than bf16's.
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2**-7: one ulp at magnitudes in [1, 2)

# A batch-variant op moves its own output by 1-2 ulps (another summation order); the chain
# carries that through about ten ops (norms, W8A8 GEMMs with per-token requantisation, the gated
# delta rule, the MoE with top-k routing) before the last compared tensor, each of which can add
# an ulp of its own; 16 ulps of the tensor's magnitude is that budget with 2x headroom. A fault
# that writes wrong rows (a stale slot, another request's row) moves values by their whole
# magnitude, 2**7 ulps, far above it. Per tensor: the canary token ids are exact (a changed
# greedy token is corruption by definition), integer tensors are exact.
ULPS = {"default": 16, "head.token_ids": 0}

# Under nondeterminism the replay's difference is held against what the kernel itself showed on
# identical inputs at this step (max |exact - exact'|, |padded - padded'|). The replay is one more
# draw from the same spread as the eager result, so |replay - eager| can reach twice the spread
# observed between two draws; beyond that it is not the kernel's noise.
NOISE_FACTOR = 2.0


def bound(key: str, ref: torch.Tensor, mag: float | None = None) -> float:
    """The largest |d| a rounding difference may produce in tensor `key` (see `ULPS`); `mag`:
    `magnitude(ref)` where the caller has it."""
    if not ref.is_floating_point():
        return 0.0
    eps = max(torch.finfo(ref.dtype).eps, BF16_EPS)
    return ULPS.get(key, ULPS["default"]) * eps * (magnitude(ref) if mag is None else mag)


def _locate(batch, key: str, a: torch.Tensor, b: torch.Tensor) -> tuple:
    """(row, request, slot) of the first difference: token rows for outputs, slots for state."""
    row = first_row(a, b)
    if key.endswith("_state"):
        return None, block_owner(batch, row), row
    return (row, *row_owner(batch, row))


def tie_flip(ref: dict, other: dict, logits) -> bool:
    """Whether every changed canary token is a near-tie that rounding explains: in each copy's own
    logits, the margin between its token and the other copy's is within the logits' calibrated
    bound. A trained model's canary prompts have wide margins; a random tiny model has ties."""
    if logits is None or "submod1.hidden" not in ref:
        return False
    ta, tb = ref["head.token_ids"], other["head.token_ids"]
    la, lb = logits(ref["submod1.hidden"]), logits(other["submod1.hidden"])
    lim = bound("logits", la)
    for i in (ta != tb).nonzero().flatten().tolist():
        a, b = int(ta[i]), int(tb[i])
        if float(la[i, a] - la[i, b]) > lim or float(lb[i, b] - lb[i, a]) > lim:
            return False
    return True


def corruption(batch, ref: dict, other: dict, names: tuple, noise: dict | None = None,
               logits=None, usage: dict | None = None, sums: dict | None = None) -> Divergence | None:
    """The first tensor where `other` departs from `ref` beyond a rounding difference: a non-finite
    value in one copy only, a changed canary token (unless `tie_flip` with `logits(hidden)`), or
    |d| above the calibrated bound (or above NOISE_FACTOR x the kernel's measured noise).
    `usage`: {tensor: the largest |d| / bound seen within it} is raised for every tensor compared
    (how close rounding comes to the bound: the bound's calibration, measured run by run). The
    statistics of every tensor are read together (`compare.summaries`: one transfer on a device, a
    second where a value is non-finite; `sums`: read by the caller already, of these very pairs)."""
    keys = ordered(ref)
    sums = sums if sums is not None else summaries({k: (ref[k], other[k]) for k in keys})
    for key in keys:
        a, b, s = ref[key], other[key], sums[key]
        if usage is not None:
            usage.setdefault(key, 0.0)  # 0: the same bits at every step
        if s.same or (key == "head.token_ids" and tie_flip(ref, other, logits)):
            continue
        isl, name = key.split(".", 1)
        side = s.side(names) if s.floating else nonfinite_side(a, b, names)
        d = s.max_abs if s.floating else max_abs(a, b)
        if side is not None:
            return Divergence(batch.step, isl, name, *_locate(batch, key, a, b), d, kind=CORRUPTION, nonfinite=side,
                              reason=f"a non-finite value in {side} only" if side in names else
                              "non-finite values differ between the copies")
        mag = s.magnitude if s.floating else magnitude(a)
        lim = bound(key, a, mag)
        why = f"{ULPS.get(key, ULPS['default'])} bf16 ulps of max|x| {mag:.3g}"
        if noise and key in noise and NOISE_FACTOR * noise[key] > lim:
            lim, why = NOISE_FACTOR * noise[key], f"{NOISE_FACTOR:g}x the kernel's own noise {noise[key]:.3g}"
        if usage is not None and 0 < lim and d <= lim:  # rounding's use of it (a departure is a finding)
            usage[key] = max(usage.get(key, 0.0), d / lim)
        if d > lim:
            reason = ("the canary token changed" if key == "head.token_ids"
                      else f"|d| {d:.3g} exceeds the bound {lim:.3g} ({why})")
            return Divergence(batch.step, isl, name, *_locate(batch, key, a, b), d, kind=CORRUPTION, reason=reason,
                              bound=lim)
    return None


# What a MoE top-k flip moves: the flipped token's rows of these tensors, and nothing else (the
# block comes after the GDN state update, so no state and no other row sees it).
ROUTED = ("submod1.hidden", "submod1.next_normed", "head.token_ids")


def routing_ties(x_ref: torch.Tensor, x_other: torch.Tensor, router_w: torch.Tensor, top_k: int,
                 rows) -> dict:
    """{row: why} for each of `rows` whose MoE routing may have flipped by rounding alone: the two
    router inputs agree within their own bound, and in either copy's router logits some expert
    inside the top-k leads some expert outside it by no more than that input difference can move
    their logits apart (max|dx| x the L1 norm of the two router rows' difference) plus two bf16 ulps
    of the largest logit (logits rounded to bf16 before the top-k, as the reference kernel does;
    its lowest-index rule then breaks the exact ties). A flip moves its token's output by a whole
    expert's share, far beyond the ulp budget, so a kernel that rounds differently from `reference`
    trips it at such a near-tie; a random tiny model's router has many. The kernel's own choice is
    not visible from outside it, so the test is that a flip was possible, not that it happened;
    a row whose router is far from any boundary, or whose inputs moved more, is left to the
    comparison."""
    w = router_w.float()
    la = torch.nn.functional.linear(x_ref.float(), w)
    lb = torch.nn.functional.linear(x_other.float(), w)
    out = {}
    for r in rows:
        dx = max_abs(x_ref[r], x_other[r])
        if dx > bound("moe_in", x_ref[r]):
            continue  # router inputs apart by more than rounding: never excused
        for logits in (la[r], lb[r]):
            inside = torch.zeros_like(logits, dtype=torch.bool)
            inside[logits.topk(top_k).indices] = True
            e, f = inside.nonzero().flatten(), (~inside).nonzero().flatten()
            margin = logits[e][:, None] - logits[f][None, :]
            spread = (w[e][:, None, :] - w[f][None, :, :]).abs().sum(-1)
            slack = dx * spread + 2 * BF16_EPS * float(logits.abs().max())
            close = (margin <= slack).nonzero()
            if len(close):
                i, j = (int(v) for v in close[0])
                out[r] = (f"row {r}: a router near-tie: expert {int(e[i])} (in the top {top_k}) leads expert "
                          f"{int(f[j])} by {float(margin[i, j]):.3g}, within the {float(slack[i, j]):.3g} that the "
                          f"router inputs' difference ({dx:.3g}, within their bound) and the logits' rounding can move")
                break
    return out


def router_ties(ref: dict, other: dict, routing, sums: dict | None = None) -> dict:
    """The rows where a float tensor the MoE feeds (`ROUTED`) is beyond its bound between `ref` and
    `other` that a router near-tie explains (`routing_ties`); the canary token of such a row is
    excused with it, and a token flip alone is `tie_flip`'s to judge. `routing()`: (ref's MoE
    input, other's, router weight, top_k), or None: then {}. `sums`: the pairs' `compare.summaries`
    where the caller has read them: no row is over where every pair is the same, or its max|d| is
    within the bound with no value non-finite on one side only (inf facing a finite value is over;
    NaN never is), and then nothing more is read."""
    if sums is not None and all(_quiet(k, ref[k], sums.get(k)) for k in ROUTED if k in ref and k in other
                                and ref[k].is_floating_point()):
        return {}
    got = routing() if routing is not None else None
    if got is None:
        return {}
    x_ref, x_other, router_w, top_k = got
    n = min(x_ref.shape[0], x_other.shape[0], *(ref[k].shape[0] for k in ROUTED if k in ref))
    over = torch.zeros(n, dtype=torch.bool, device=x_ref.device)
    for k in (k for k in ROUTED if k in ref and k in other and ref[k].is_floating_point()):
        d = (ref[k][:n].float() - other[k][:n].float()).abs()
        over |= (d.amax(-1) if d.dim() > 1 else d) > bound(k, ref[k])
    return routing_ties(x_ref, x_other, router_w, top_k, over.nonzero().flatten().tolist())


def _quiet(key: str, ref: torch.Tensor, s) -> bool:
    """`summaries` shows no row of `key` beyond its bound (`router_ties`)."""
    if s is None:
        return False
    return s.same or (s.floating and not (s.only_a or s.only_b or s.both_differ)
                      and s.max_abs <= bound(key, ref, s.magnitude))


def routing_inputs(x_ref, x_other, moe) -> tuple | None:
    """What `router_ties` reads: (two MoE inputs of one step, `moe`'s router weight, its top_k),
    or None when either input was not kept."""
    if x_ref is None or x_other is None:
        return None
    return x_ref, x_other, moe.w.gate, moe.cfg.num_experts_per_tok


def excuse_rows(other: dict, ref: dict, rows) -> dict:
    """`other` with `rows` of the `ROUTED` tensors set to `ref`'s (a router near-tie there)."""
    if not rows:
        return other
    idx = sorted(rows)
    out = dict(other)
    for k in ROUTED:
        if k in out and k in ref:
            out[k] = out[k].clone()
            out[k][idx] = ref[k][idx]
    return out


def _noise(a: dict, b: dict | None) -> dict:
    return {} if b is None else {k: max_abs(a[k], b[k]) for k in a if not same(a[k], b[k])}


# Before replay is called a graph hazard, the reference is re-run this many more times: a
# nondeterministic kernel can agree with itself twice by chance (a one-row step, a perturbation
# that rounds away), and a graph hazard is only claimed against a reference that reproduces.
CONFIRM_RUNS = 4


def decide(batch, div: Divergence, eager: dict, replay: dict, exact: tuple, padded: tuple | None,
           size: int | None, logits=None, rerun=None, rerun_exact=None, routing=None) -> Divergence:
    """Classify `div` (the first eager/replay difference) from the probe runs: `exact` = two exact-
    shape eager runs, `padded` = two padded-shape eager runs (None: the step ran unpadded), all
    from the same pre-step state; `logits(hidden)`: the canary head's logits (for `tie_flip`);
    `rerun()`: one more run of the reference (padded, or exact when unpadded), for `CONFIRM_RUNS`;
    `rerun_exact()`: one more exact-shape run, so batch variance is only claimed against an exact
    run that reproduces (a kernel whose call-to-call noise is under an ulp often draws equal bits
    twice); `routing()`: (the exact run's MoE input, the padded run's, router weight, top_k), so an
    expert flip at a near-tie between the two shapes is batch variance (`routing_ties`). Returns
    `div` with kind, reason (and bound), or the corruption found elsewhere."""
    noise = _noise(*exact)
    if padded is not None:
        for k, v in _noise(*padded).items():
            noise[k] = max(noise.get(k, 0.0), v)
    ref = padded[0] if padded is not None else exact[0]
    if not noise and rerun is not None and compare_outputs(batch, ref, replay) is not None:
        for _ in range(CONFIRM_RUNS):  # a graph hazard is only claimed against a reproducible reference
            noise = _noise(ref, rerun())
            if noise:
                break
    if not noise and padded is not None and rerun_exact is not None \
            and compare_outputs(batch, exact[0], padded[0]) is not None:
        for _ in range(CONFIRM_RUNS):  # batch variance only against an exact run that reproduces
            noise = _noise(exact[0], rerun_exact())
            if noise:
                break
    if noise:
        bad = corruption(batch, eager, replay, ("eager", "replay"), noise, logits)
        if bad is not None:
            return replace(bad, reason=bad.reason + "; the kernel is also nondeterministic on identical inputs")
        worst = max(noise, key=noise.get)
        return replace(div, kind=NONDETERMINISM, reason=f"the same eager call on identical inputs differs "
                                                        f"(first in {worst}, by up to {noise[worst]:.3g})")
    hz = compare_outputs(batch, ref, replay, ("padded eager", "replay"))
    if hz is not None:
        shape = f"padded to {size} rows" if padded is not None else "at the same shape"
        return replace(div, kind=GRAPH_HAZARD, nonfinite=hz.nonfinite if hz.nonfinite is not None else div.nonfinite,
                       reason=f"replay differs from an eager run {shape} on the same inputs, first in "
                              f"{hz.island}.{hz.tensor} (|d| {hz.max_abs:.3g})")
    ties = router_ties(eager, replay, routing) if padded is not None else {}
    bad = corruption(batch, eager, excuse_rows(replay, eager, ties), ("eager", "replay"), logits=logits)
    if bad is not None:
        return replace(bad, reason=bad.reason + f"; replay equals the eager run padded to {size} rows")
    lim = bound(f"{div.island}.{div.tensor}", eager[f"{div.island}.{div.tensor}"])
    if size == batch.num_tokens:  # no pad rows: two runs of one shape differ, so the kernel varies by call
        return replace(div, kind=NONDETERMINISM, bound=lim,
                       reason=f"replay equals an eager run at the same {size} rows bit for bit, and another eager "
                              f"run of that shape differs within {ULPS['default']} bf16 ulps: the kernel varies "
                              "from call to call")
    reason = (f"replay equals an eager run padded to {size} rows bit for bit; the exact-shape eager "
              f"run rounds differently, within {ULPS['default']} bf16 ulps of each tensor's magnitude")
    if ties:
        reason += f", except {len(ties)} row(s) whose MoE expert flipped between the two shapes: {ties[min(ties)]}"
    return replace(div, kind=BATCH_VARIANCE, bound=lim, reason=reason)
