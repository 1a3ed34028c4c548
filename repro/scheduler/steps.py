"""A sequence's steps: its requests given to the scheduler (`scheduler.Scheduler`) in arrival order
and stepped until every one has finished, with an idle data-parallel rank's dummy steps, and each
step naming the other data-parallel rank's batch where the sequence gives one (`dp_peers`)."""
from __future__ import annotations

from ..control.batch import StepBatch
from ..errors import BadInput
from .config import SchedulerConfig
from .prefix import ALIGN_BLOCKS
from .scheduler import Scheduler
from ..control.shape import decode_len

TICK_LIMIT = 10_000  # ticks past the last arrival: a sequence that has not finished by then never will


def block_pool(num_slots: int, spec_tokens: int = 0, first: int = 1) -> list[int]:
    """The state blocks of `num_slots` concurrent requests with K = `spec_tokens`: 1+K each, from
    `first` (1 with the pad sentinel 0, whose block 0 is the null block; 0 with the sentinel -1)."""
    return list(range(first, first + num_slots * decode_len(spec_tokens)))


def scheduler_config(seq) -> SchedulerConfig:
    """The settings of `seq` beyond its budget (`config.SchedulerConfig`)."""
    return SchedulerConfig(seq.max_num_scheduled_tokens, seq.long_prefill_token_threshold, seq.async_scheduling)


def schedule(seq, usable_slots=None) -> list[StepBatch]:
    """The steps of `seq` (a `sequence.Sequence`): its requests added in arrival order, one
    `Scheduler.step` a tick, a dummy step on each idle tick of a data-parallel rank while requests
    are still to arrive, and `tail_dummies` dummy steps after the last request finishes. With
    `dp_peers`, step i names the other rank's batch `dp_peers[i % len(dp_peers)]` (`StepBatch.dp_peer`).

    `usable_slots`: the state rows requests may use, as `Sequence.batches` takes them (None:
    1..num_slots, the pad sentinel 0's; range(num_slots): the sentinel -1's). With K > 0 every
    request needs 1+K blocks: the pool is num_slots * (1+K) consecutive blocks from the lowest
    usable row."""
    k, bs = seq.spec_tokens, seq.block_size
    if bs:  # a request slot's blocks are ALIGN_BLOCKS + K, from the lowest usable row; the null block below it
        first = 1 if usable_slots is None else min(usable_slots)
        pool = block_pool(seq.num_slots, ALIGN_BLOCKS - 1 + k, first)
    elif usable_slots is None:
        pool = block_pool(seq.num_slots, k)
    elif k == 0:
        pool = list(usable_slots)
    else:
        pool = block_pool(seq.num_slots, k, min(usable_slots))
    if seq.tail_dummies and not seq.data_parallel:
        raise BadInput(f"tail_dummies {seq.tail_dummies} needs data_parallel (only an idle data-parallel rank runs one)")
    sched = Scheduler(seq.max_tokens, pool, k, seq.vocab, seq.seed, seq.data_parallel, bs,
                      seq.num_slots if bs else None, (min(pool) - 1) if bs else 0, scheduler_config(seq))
    for r in sorted(seq.requests, key=lambda r: (r.arrive, r.rid)):
        sched.add(r.rid, r.prompt_len, r.decode_steps, r.arrive, r.preempt_after, r.accept, r.prefix_of, r.prefix_len)
    limit = TICK_LIMIT + max((r.arrive for r in seq.requests), default=0)
    steps: list[StepBatch] = []
    while not sched.done():
        if seq.data_parallel and sched.idle():
            steps.append(sched.dummy())
        else:
            b = sched.step()
            if b is not None:
                steps.append(b)
        if sched.tick > limit:
            raise BadInput("the sequence does not finish (a request can never be scheduled)")
    steps.extend(sched.dummy() for _ in range(seq.tail_dummies))
    for i, b in enumerate(steps if seq.dp_peers else ()):
        b.dp_peer = list(seq.dp_peers[i % len(seq.dp_peers)])
    return steps
