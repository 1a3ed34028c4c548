"""The JSON form of a request sequence, checked field by field before anything runs: a sequence a
user hands in (`--sequence`) or a hunt saved is refused with the field named, never half-run."""
from __future__ import annotations

import json

from ..errors import BadInput
from ..knobs.stacks import STACKS
from .config import SchedulerConfig
from .prefix import ALIGN_BLOCKS, MAX_BLOCK_SIZE, check_block_size
from .scheduler import MAX_SPEC_TOKENS
from ..control.shape import decode_len

_REQ = {"rid": (int,), "prompt_len": (int,), "decode_steps": (int,), "arrive": (int,), "preempt_after": (int, None),
        "accept": (list, None), "prefix_of": (int, None), "prefix_len": (int,)}
_STEP = ("step", "request_ids", "slots", "query_lens", "has_initial_state", "token_ids")
# Per-request lists a step may carry beyond the first five (`StepBatch`), each entry's range as a
# function of K: num_accepted is 1..1+K, draft_lens 0..K.
_PER_REQUEST = {"num_computed": lambda k: (0, None), "prompt_lens": lambda k: (1, None), "prefill_lens": lambda k: (1, None),
                "draft_lens": lambda k: (0, k), "num_accepted": lambda k: (1, decode_len(k)),
                "num_output_placeholders": lambda k: (0, decode_len(k))}
_STEP_OPTIONAL = ("live_slots", *_PER_REQUEST, "blocks", "finished", "dummy", "block_size", "state_cols", "prev_cols",
                  "post_copies", "lagged", "dp_peer")
MAX_SLOTS = 4096
PROMPT_BUDGETS = 64  # a prompt may span this many steps' budgets (chunked prefill)


def check_int(v, src: str, lo: int | None = None, hi: int | None = None, none: bool = False):
    """An integer in lo..hi (None: unbounded; `none`: None allowed), else one line naming `src`."""
    if v is None and none:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadInput(f"{src}: expected an integer, got {json.dumps(v)[:40]}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadInput(f"{src}: {v} is out of range {lo if lo is not None else ''}..{hi if hi is not None else ''}")


def _slot(v, src: str, blocks: int) -> None:
    """A state block: an integer that is a block for one of the two pad sentinels. Which one the
    run uses is known only when it starts (`Sequence.check_fits`), so the message names both
    ranges in the words `check_fits` uses for the one it checks."""
    check_int(v, src)
    if not 0 <= v <= blocks:
        raise BadInput(f"{src}: {v} is out of range 1..{blocks} (pad sentinel 0) and 0..{blocks - 1} "
                       f"(pad sentinel -1) for {blocks} state blocks")


def _bool(v, src: str) -> None:
    if not isinstance(v, bool):
        raise BadInput(f"{src}: expected true or false, got {json.dumps(v)[:40]}")


def _list(v, src: str) -> list:
    if not isinstance(v, list):
        raise BadInput(f"{src}: expected a list, got {type(v).__name__}")
    return v


def check_stack(v, src: str) -> None:
    """The stack profile a sequence was found on, if it names one: a profile this suite knows."""
    if v is not None and (not isinstance(v, str) or v not in STACKS):
        raise BadInput(f"{src}: {json.dumps(v)[:40]} is not a stack profile (known: {', '.join(STACKS)})")


def check_json(d, source: str = "sequence") -> None:
    """Refuse, naming the field, any sequence object the scheduler or the runner could not replay
    faithfully: wrong types, missing or unknown keys, out-of-range slots and lengths, duplicate
    slots in a step, steps longer than the token budget (a 300-token step with max_tokens 8 would
    overflow the captured buffers and be reported as a false divergence)."""
    if not isinstance(d, dict):
        raise BadInput(f"{source}: expected a JSON object with requests or steps, got {type(d).__name__}")
    known = {"requests", "num_slots", "max_tokens", "vocab", "seed", "steps", "max_steps", "spec_tokens",
             "data_parallel", "tail_dummies", "block_size", "max_num_scheduled_tokens", "long_prefill_token_threshold",
             "async_scheduling", "dp_peers", "stack"}
    extra = sorted(set(d) - known)
    if extra:
        raise BadInput(f"{source}: unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")
    check_stack(d.get("stack"), f"{source}: stack")
    check_int(d.get("num_slots", 8), f"{source}: num_slots", 1, MAX_SLOTS)
    check_int(d.get("max_tokens", 16), f"{source}: max_tokens", 1, 65536)
    check_int(d.get("vocab", 512), f"{source}: vocab", 1)
    check_int(d.get("seed", 0), f"{source}: seed")
    check_int(d.get("max_steps"), f"{source}: max_steps", 1, none=True)
    check_int(d.get("spec_tokens", 0), f"{source}: spec_tokens", 0, MAX_SPEC_TOKENS)
    _bool(d.get("data_parallel", False), f"{source}: data_parallel")
    check_int(d.get("tail_dummies", 0), f"{source}: tail_dummies", 0, 100_000)
    num_slots, max_tokens, k = d.get("num_slots", 8), d.get("max_tokens", 16), d.get("spec_tokens", 0)
    bs = d.get("block_size")
    check_int(bs, f"{source}: block_size", 1, MAX_BLOCK_SIZE, none=True)
    try:
        check_block_size(bs, k)
    except BadInput as e:
        raise BadInput(f"{source}: {e}") from None
    if max_tokens < decode_len(k):
        raise BadInput(f"{source}: max_tokens {max_tokens} cannot hold one decode of 1+spec_tokens = {decode_len(k)} tokens")
    if d.get("tail_dummies", 0) and not d.get("data_parallel", False):
        raise BadInput(f"{source}: tail_dummies {d['tail_dummies']} needs data_parallel (only an idle "
                       "data-parallel rank runs dummy steps)")
    _check_scheduler(d, source, max_tokens, k, num_slots)
    reqs = _list(d.get("requests", []), f"{source}: requests")
    steps = _list(d.get("steps", []), f"{source}: steps")
    if not reqs and not steps:
        raise BadInput(f"{source}: no requests and no steps (nothing to replay)")
    rids: set[int] = set()
    for i, r in enumerate(reqs):
        _check_request(r, f"{source}: requests[{i}]", max_tokens, k)
        if r["rid"] in rids:
            raise BadInput(f"{source}: requests[{i}].rid: {r['rid']} is the rid of an earlier request too")
        rids.add(r["rid"])
    _check_prefixes(reqs, source)
    for i, s in enumerate(steps):
        src = f"{source}: steps[{i}]"
        if s.get("block_size") if isinstance(s, dict) else None:
            if s["block_size"] != bs:
                raise BadInput(f"{src}.block_size: {json.dumps(s['block_size'])[:40]}, but the sequence's block_size "
                               f"is {bs}")
        _check_step(s, src, num_slots * ((ALIGN_BLOCKS if bs else 1) + k), max_tokens, d.get("vocab", 512), k, bs)
        if s.get("dp_peer") is not None:
            _check_peer(s["dp_peer"], f"{src}.dp_peer", d, max_tokens, k, num_slots)
        if s["step"] != i:
            raise BadInput(f"{src}.step: {s['step']}, but it is step {i} of the file (steps are numbered 0, 1, 2, ...)")
        _check_request_ids(s["request_ids"], src, rids)


def _check_scheduler(d: dict, source: str, max_tokens: int, k: int, num_slots: int) -> None:
    """The scheduler settings beyond the budget (`config.SchedulerConfig`) and the other
    data-parallel rank's batches (`dp_peers`, cycled over the steps)."""
    check_int(d.get("max_num_scheduled_tokens"), f"{source}: max_num_scheduled_tokens", 1, 65536, none=True)
    check_int(d.get("long_prefill_token_threshold", 0), f"{source}: long_prefill_token_threshold", 0, 65536)
    _bool(d.get("async_scheduling", False), f"{source}: async_scheduling")
    SchedulerConfig(d.get("max_num_scheduled_tokens"), d.get("long_prefill_token_threshold", 0),
                    d.get("async_scheduling", False)).check(max_tokens, k, source)
    peers = d.get("dp_peers")
    if peers is None:
        return
    if not _list(peers, f"{source}: dp_peers"):
        raise BadInput(f"{source}: dp_peers: empty (leave it out for no data-parallel coordination)")
    for i, p in enumerate(peers):
        _check_peer(p, f"{source}: dp_peers[{i}]", d, max_tokens, k, num_slots)


def _check_peer(p, src: str, d: dict, max_tokens: int, k: int, num_slots: int) -> None:
    """The other data-parallel rank's batch: [num_tokens 0..max_tokens, uniform]; 0 tokens is an
    idle rank, whose dummy run is a uniform decode ([0, true]); a uniform batch is whole decodes of
    1+K tokens, at most num_slots of them."""
    if not d.get("data_parallel", False):
        raise BadInput(f"{src}: the other data-parallel rank's batch needs data_parallel")
    if len(_list(p, src)) != 2:
        raise BadInput(f"{src}: {len(p)} entries, not [num_tokens, uniform]")
    check_int(p[0], f"{src}[0]", 0, max_tokens)
    _bool(p[1], f"{src}[1]")
    q = decode_len(k)
    if p[0] == 0 and not p[1]:
        raise BadInput(f"{src}: [0, false], but an idle rank's dummy run is a uniform decode: [0, true]")
    if p[0] and p[1] and (p[0] % q or p[0] // q > num_slots):
        raise BadInput(f"{src}: a uniform batch of {p[0]} tokens is not whole decodes of 1+spec_tokens = {q} tokens "
                       f"for at most num_slots {num_slots} requests")


def _check_prefixes(reqs: list, source: str) -> None:
    """Shared prefixes: `prefix_of` names another request, `prefix_len` is at most both prompts, and
    following prefix_of never comes back to where it started."""
    by_rid = {r["rid"]: r for r in reqs}
    for i, r in enumerate(reqs):
        src, of, n = f"{source}: requests[{i}]", r.get("prefix_of"), r.get("prefix_len", 0)
        if of is None:
            if n:
                raise BadInput(f"{src}.prefix_len: {n} without prefix_of (whose tokens would it repeat?)")
            continue
        if of == r["rid"] or of not in by_rid:
            raise BadInput(f"{src}.prefix_of: {of} is not the rid of another request")
        check_int(n, f"{src}.prefix_len", 1, min(r["prompt_len"], by_rid[of]["prompt_len"]))
        seen, at = {r["rid"]}, of
        while by_rid[at].get("prefix_of") is not None and by_rid[at].get("prefix_len", 0):
            if at in seen:
                raise BadInput(f"{src}.prefix_of: {of} leads back to request {at} (prefixes form a cycle)")
            seen.add(at)
            at = by_rid[at]["prefix_of"]


def _check_request_ids(ids: list, src: str, rids: set[int]) -> None:
    """A step's requests: each scheduled once, and each one of the file's requests when it lists any."""
    for j, v in enumerate(ids):
        if rids and v not in rids:
            raise BadInput(f"{src}.request_ids[{j}]: request id {v} is not in requests (rids: "
                           f"{', '.join(map(str, sorted(rids)[:8]))}{', ...' if len(rids) > 8 else ''})")
    if len(set(ids)) != len(ids):
        dup = next(x for x in ids if ids.count(x) > 1)
        raise BadInput(f"{src}.request_ids: duplicate request id {dup} (a request is scheduled once a step)")


def _check_request(r, src: str, max_tokens: int, k: int) -> None:
    if not isinstance(r, dict):
        raise BadInput(f"{src}: expected an object, got {type(r).__name__}")
    missing = [key for key in ("rid", "prompt_len", "decode_steps") if key not in r]
    if missing:
        raise BadInput(f"{src}: missing key {missing[0]!r}")
    for key in r:
        if key not in _REQ:
            raise BadInput(f"{src}: unknown key {key!r}")
    check_int(r["rid"], f"{src}.rid", 0)
    check_int(r["prompt_len"], f"{src}.prompt_len", 1, PROMPT_BUDGETS * max_tokens)
    check_int(r["decode_steps"], f"{src}.decode_steps", 0, 100_000)
    check_int(r.get("arrive", 0), f"{src}.arrive", 0, 100_000)
    check_int(r.get("preempt_after"), f"{src}.preempt_after", 1, none=True)
    check_int(r.get("prefix_of"), f"{src}.prefix_of", 0, none=True)
    check_int(r.get("prefix_len", 0), f"{src}.prefix_len", 0)
    if r.get("accept") is not None:
        if not _list(r["accept"], f"{src}.accept"):
            raise BadInput(f"{src}.accept: empty (leave it out, or null, to keep every draft)")
        for j, v in enumerate(r["accept"]):
            check_int(v, f"{src}.accept[{j}]", 1, decode_len(k))


def _check_step(s, src: str, blocks: int, max_tokens: int, vocab: int, k: int, bs: int | None = None) -> None:
    """One explicit step; `blocks`: the highest state block (num_slots * blocks a request slot adds)."""
    if not isinstance(s, dict):
        raise BadInput(f"{src}: expected an object, got {type(s).__name__}")
    for key in _STEP:
        if key not in s:
            raise BadInput(f"{src}: missing key {key!r}")
    for key in s:
        if key not in _STEP and key not in _STEP_OPTIONAL:
            raise BadInput(f"{src}: unknown key {key!r}")
    check_int(s["step"], f"{src}.step", 0)
    dummy = s.get("dummy", False)
    _bool(dummy, f"{src}.dummy")
    n = len(_list(s["request_ids"], f"{src}.request_ids"))
    if n == 0 and not dummy:
        raise BadInput(f"{src}.request_ids: empty (a step schedules at least one request; a dummy step says dummy)")
    if n and dummy:
        raise BadInput(f"{src}.request_ids: {n} requests in a dummy step (an idle rank's dummy run has none)")
    for key in ("slots", "query_lens", "has_initial_state"):
        if len(_list(s[key], f"{src}.{key}")) != n:
            raise BadInput(f"{src}.{key}: {len(s[key])} entries, but request_ids has {n}")
    for j, v in enumerate(s["request_ids"]):
        check_int(v, f"{src}.request_ids[{j}]", 0)
    for j, v in enumerate(s["slots"]):
        _slot(v, f"{src}.slots[{j}]", blocks)
    if len(set(s["slots"])) != n:
        raise BadInput(f"{src}.slots: duplicate slot {next(x for x in s['slots'] if s['slots'].count(x) > 1)} "
                       "(two requests of one step cannot share a state slot)")
    for j, v in enumerate(s["query_lens"]):
        check_int(v, f"{src}.query_lens[{j}]", 1, max_tokens)
    for j, v in enumerate(s["has_initial_state"]):
        _bool(v, f"{src}.has_initial_state[{j}]")
    toks = _list(s["token_ids"], f"{src}.token_ids")
    if len(toks) != sum(s["query_lens"]):
        raise BadInput(f"{src}.token_ids: {len(toks)} ids, but query_lens sum to {sum(s['query_lens'])}")
    if len(toks) > max_tokens:
        raise BadInput(f"{src}.token_ids: {len(toks)} tokens in one step, more than max_tokens {max_tokens}")
    for j, v in enumerate(toks):
        check_int(v, f"{src}.token_ids[{j}]", 0, vocab - 1)
    for j, v in enumerate(_list(s.get("live_slots", []), f"{src}.live_slots")):
        _slot(v, f"{src}.live_slots[{j}]", blocks)
    for j, v in enumerate(_list(s.get("finished", []), f"{src}.finished")):
        check_int(v, f"{src}.finished[{j}]", 0)
    for j, v in enumerate(_list(s.get("lagged", []), f"{src}.lagged")):
        if v not in s["request_ids"] or s["lagged"].index(v) != j:
            raise BadInput(f"{src}.lagged[{j}]: {json.dumps(v)[:40]} is not a request of this step, once")
    for j, c in enumerate(_list(s.get("post_copies", []), f"{src}.post_copies")):
        if bs is None:
            raise BadInput(f"{src}.post_copies: boundary-state copies need a block_size")
        if len(_list(c, f"{src}.post_copies[{j}]")) != 4:
            raise BadInput(f"{src}.post_copies[{j}]: {len(c)} entries, not [dst, conv_src, conv_offset, ssm_src]")
        for m, v in enumerate(c):
            check_int(v, f"{src}.post_copies[{j}][{m}]", 0, k if m == 2 else blocks)
    _check_request_lists(s, src, n, blocks, k, bs)


def _check_request_lists(s: dict, src: str, n: int, blocks: int, k: int, bs: int | None = None) -> None:
    """The optional per-request lists: one entry a request, in range, and agreeing with the first
    five (has_initial_state is num_computed > 0; a row's drafts end its query; its first block is
    its slot; no block held by two requests)."""
    for key, bounds in _PER_REQUEST.items():
        if key not in s:
            continue
        if len(_list(s[key], f"{src}.{key}")) != n:
            raise BadInput(f"{src}.{key}: {len(s[key])} entries, but request_ids has {n}")
        lo, hi = bounds(k)
        for j, v in enumerate(s[key]):
            check_int(v, f"{src}.{key}[{j}]", lo, hi)
    if "num_computed" in s:
        for j, (c, h) in enumerate(zip(s["num_computed"], s["has_initial_state"])):
            if h != (c > 0):
                raise BadInput(f"{src}.has_initial_state[{j}]: {json.dumps(h)}, but num_computed[{j}] is {c}")
    if "draft_lens" in s:
        for j, (dl, q) in enumerate(zip(s["draft_lens"], s["query_lens"])):
            if dl >= q:
                raise BadInput(f"{src}.draft_lens[{j}]: {dl} drafts in a query of {q} (a spec row also has its bonus token)")
    if "blocks" not in s:
        return
    rows = _list(s["blocks"], f"{src}.blocks")
    if len(rows) != n:
        raise BadInput(f"{src}.blocks: {len(rows)} entries, but request_ids has {n}")
    if bs is not None:
        _check_aligned_rows(s, src, rows, n, blocks, k, bs)
        return
    for j, row in enumerate(rows):
        if len(_list(row, f"{src}.blocks[{j}]")) != decode_len(k):
            raise BadInput(f"{src}.blocks[{j}]: {len(row)} blocks, but a request holds 1+spec_tokens = {decode_len(k)}")
        for m, v in enumerate(row):
            check_int(v, f"{src}.blocks[{j}][{m}]", 0, blocks)
        if row[0] != s["slots"][j]:
            raise BadInput(f"{src}.blocks[{j}]: starts at {row[0]}, but slots[{j}] is {s['slots'][j]} "
                           "(a request's slot is its running block, the first)")
    held = [v for row in rows for v in row]
    if len(set(held)) != len(held):
        raise BadInput(f"{src}.blocks: block {next(x for x in held if held.count(x) > 1)} held by two requests")


def _check_aligned_rows(s: dict, src: str, rows: list, n: int, blocks: int, k: int, bs: int) -> None:
    """A step's rows with a block size: each running column is (seq_len - 1) // block_size, its
    previous one -1 or before it, its row ends with the running column and K more, its slot is the
    running column's block, and no block one request writes (running or speculative) is held by another."""
    for key in ("state_cols", "prev_cols"):
        if len(_list(s.get(key), f"{src}.{key}")) != n:
            raise BadInput(f"{src}.{key}: {len(s[key])} entries, but request_ids has {n}")
    written = []
    for j, row in enumerate(rows):
        col, prev = s["state_cols"][j], s["prev_cols"][j]
        check_int(col, f"{src}.state_cols[{j}]", 0)
        check_int(prev, f"{src}.prev_cols[{j}]", -1, col)
        if "num_computed" in s and col != (s["num_computed"][j] + s["query_lens"][j] - 1) // bs:
            raise BadInput(f"{src}.state_cols[{j}]: {col}, but (num_computed + query_len - 1) // block_size is "
                           f"{(s['num_computed'][j] + s['query_lens'][j] - 1) // bs}")
        if len(_list(row, f"{src}.blocks[{j}]")) != col + decode_len(k):
            raise BadInput(f"{src}.blocks[{j}]: {len(row)} blocks, but its running column {col} and {k} after it "
                           f"make {col + decode_len(k)}")
        for m, v in enumerate(row):
            check_int(v, f"{src}.blocks[{j}][{m}]", -1, blocks)
        if row[col] != s["slots"][j]:
            raise BadInput(f"{src}.blocks[{j}]: column {col} is {row[col]}, but slots[{j}] is {s['slots'][j]} "
                           "(a request's slot is its running column's block)")
        written += row[col:]
    held = {v for j, row in enumerate(rows) for m, v in enumerate(row) if m < s["state_cols"][j]}
    dup = next((v for v in written if written.count(v) > 1 or v in held), None)
    if dup is not None:
        raise BadInput(f"{src}.blocks: block {dup} is written by one request and held by another")
