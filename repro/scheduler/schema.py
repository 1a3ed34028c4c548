"""The JSON form of a request sequence, checked field by field before anything runs: a sequence a
user hands in (`--sequence`) or a hunt saved is refused with the field named, never half-run."""
from __future__ import annotations

import json

from ..errors import BadInput

_REQ = {"rid": (int,), "prompt_len": (int,), "decode_steps": (int,), "arrive": (int,), "preempt_after": (int, None)}
_STEP = ("step", "request_ids", "slots", "query_lens", "has_initial_state", "token_ids")
MAX_SLOTS = 4096


def _int(v, src: str, lo: int | None = None, hi: int | None = None, none: bool = False):
    if v is None and none:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise BadInput(f"{src}: expected an integer, got {json.dumps(v)[:40]}")
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise BadInput(f"{src}: {v} is out of range {lo if lo is not None else ''}..{hi if hi is not None else ''}")


def _slot(v, src: str, num_slots: int) -> None:
    """A state slot: an integer that is a slot for one of the two pad sentinels. Which one the
    run uses is known only when it starts (`Sequence.check_fits`), so the message names both
    ranges in the words `check_fits` uses for the one it checks."""
    _int(v, src)
    if not 0 <= v <= num_slots:
        raise BadInput(f"{src}: {v} is out of range 1..{num_slots} (pad sentinel 0) and 0..{num_slots - 1} "
                       f"(pad sentinel -1) for num_slots {num_slots}")


def _list(v, src: str) -> list:
    if not isinstance(v, list):
        raise BadInput(f"{src}: expected a list, got {type(v).__name__}")
    return v


def check_json(d, source: str = "sequence") -> None:
    """Refuse, naming the field, any sequence object the scheduler or the runner could not replay
    faithfully: wrong types, missing or unknown keys, out-of-range slots and lengths, duplicate
    slots in a step, steps longer than the token budget (a 300-token step with max_tokens 8 would
    overflow the captured buffers and be reported as a false divergence)."""
    if not isinstance(d, dict):
        raise BadInput(f"{source}: expected a JSON object with requests or steps, got {type(d).__name__}")
    known = {"requests", "num_slots", "max_tokens", "vocab", "seed", "steps", "max_steps"}
    extra = sorted(set(d) - known)
    if extra:
        raise BadInput(f"{source}: unknown key {extra[0]!r} (known: {', '.join(sorted(known))})")
    _int(d.get("num_slots", 8), f"{source}: num_slots", 1, MAX_SLOTS)
    _int(d.get("max_tokens", 16), f"{source}: max_tokens", 1, 65536)
    _int(d.get("vocab", 512), f"{source}: vocab", 1)
    _int(d.get("seed", 0), f"{source}: seed")
    _int(d.get("max_steps"), f"{source}: max_steps", 1, none=True)
    num_slots, max_tokens, vocab = d.get("num_slots", 8), d.get("max_tokens", 16), d.get("vocab", 512)
    reqs = _list(d.get("requests", []), f"{source}: requests")
    steps = _list(d.get("steps", []), f"{source}: steps")
    if not reqs and not steps:
        raise BadInput(f"{source}: no requests and no steps (nothing to replay)")
    rids = set()
    for i, r in enumerate(reqs):
        src = f"{source}: requests[{i}]"
        if not isinstance(r, dict):
            raise BadInput(f"{src}: expected an object, got {type(r).__name__}")
        missing = [k for k in ("rid", "prompt_len", "decode_steps") if k not in r]
        if missing:
            raise BadInput(f"{src}: missing key {missing[0]!r}")
        for k in r:
            if k not in _REQ:
                raise BadInput(f"{src}: unknown key {k!r}")
        _int(r["rid"], f"{src}.rid", 0)
        if r["rid"] in rids:
            raise BadInput(f"{src}.rid: {r['rid']} is the rid of an earlier request too")
        rids.add(r["rid"])
        _int(r["prompt_len"], f"{src}.prompt_len", 1, max_tokens)
        _int(r["decode_steps"], f"{src}.decode_steps", 0, 100_000)
        _int(r.get("arrive", 0), f"{src}.arrive", 0, 100_000)
        _int(r.get("preempt_after"), f"{src}.preempt_after", 1, none=True)
    for i, s in enumerate(steps):
        src = f"{source}: steps[{i}]"
        if not isinstance(s, dict):
            raise BadInput(f"{src}: expected an object, got {type(s).__name__}")
        for k in _STEP:
            if k not in s:
                raise BadInput(f"{src}: missing key {k!r}")
        for k in s:
            if k not in _STEP and k != "live_slots":
                raise BadInput(f"{src}: unknown key {k!r}")
        _int(s["step"], f"{src}.step", 0)
        if s["step"] != i:
            raise BadInput(f"{src}.step: {s['step']}, but it is step {i} of the file (steps are numbered 0, 1, 2, ...)")
        n = len(_list(s["request_ids"], f"{src}.request_ids"))
        if n == 0:
            raise BadInput(f"{src}.request_ids: empty (a step schedules at least one request)")
        for k in ("slots", "query_lens", "has_initial_state"):
            if len(_list(s[k], f"{src}.{k}")) != n:
                raise BadInput(f"{src}.{k}: {len(s[k])} entries, but request_ids has {n}")
        for j, v in enumerate(s["request_ids"]):
            _int(v, f"{src}.request_ids[{j}]", 0)
            if rids and v not in rids:
                raise BadInput(f"{src}.request_ids[{j}]: request id {v} is not in requests (rids: "
                               f"{', '.join(map(str, sorted(rids)[:8]))}{', ...' if len(rids) > 8 else ''})")
        if len(set(s["request_ids"])) != n:
            dup = next(x for x in s["request_ids"] if s["request_ids"].count(x) > 1)
            raise BadInput(f"{src}.request_ids: duplicate request id {dup} (a request is scheduled once a step)")
        for j, v in enumerate(s["slots"]):
            _slot(v, f"{src}.slots[{j}]", num_slots)
        if len(set(s["slots"])) != n:
            raise BadInput(f"{src}.slots: duplicate slot {next(x for x in s['slots'] if s['slots'].count(x) > 1)} "
                           "(two requests of one step cannot share a state slot)")
        for j, v in enumerate(s["query_lens"]):
            _int(v, f"{src}.query_lens[{j}]", 1, max_tokens)
        for j, v in enumerate(s["has_initial_state"]):
            if not isinstance(v, bool):
                raise BadInput(f"{src}.has_initial_state[{j}]: expected true or false, got {json.dumps(v)[:40]}")
        toks = _list(s["token_ids"], f"{src}.token_ids")
        if len(toks) != sum(s["query_lens"]):
            raise BadInput(f"{src}.token_ids: {len(toks)} ids, but query_lens sum to {sum(s['query_lens'])}")
        if len(toks) > max_tokens:
            raise BadInput(f"{src}.token_ids: {len(toks)} tokens in one step, more than max_tokens {max_tokens}")
        for j, v in enumerate(toks):
            _int(v, f"{src}.token_ids[{j}]", 0, vocab - 1)
        for j, v in enumerate(_list(s.get("live_slots", []), f"{src}.live_slots")):
            _slot(v, f"{src}.live_slots[{j}]", num_slots)
