"""Block-aligned prefix caching of GDN state, the scheduler's side (vLLM's mamba cache mode "align").

Column j of a request's block-table row holds the state after exactly (j+1)*block_size tokens
(`control.prefix` has the runner's side). For that to hold, the scheduler

- ends a prefill chunk on a block boundary unless it is the prompt's last
  (`aligned_chunk`, `vllm/v1/core/sched/scheduler.py: Scheduler._mamba_block_aligned_split`);
- gives a request a block for its running column when the column moves, keeps the previous one for
  the step that copies from it, then retires it (`vllm/v1/core/single_type_kv_cache_manager.py:
  MambaManager.remove_skipped_blocks`);
- caches a block under the tokens it covers once a step has filled it, and starts a new request
  from the longest cached prefix of its tokens (`MambaManager.find_longest_cache_hit`).

`BlockPool` approximates `vllm/v1/core/block_pool.py: BlockPool`: blocks with a reference count, a
free queue that hands out its head and takes freed blocks at its tail (least recently freed first,
vLLM's `FreeKVCacheBlockQueue`), and a freed block that keeps its cached state until it is handed
out again (lazy eviction). A block is cached once the step that fills it has been scheduled and is
found by the next steps' requests (vLLM registers a block's hash when it allocates the step that
fills it). The key is the tokens themselves, not a hash chain: equal keys mean equal tokens.
"""
from __future__ import annotations

from collections import deque

from ..control.prefix import running_column
from ..errors import BadInput

MAX_BLOCK_SIZE = 1024
ALIGN_BLOCKS = 3  # state blocks a request slot adds to the pool with a block size: running, copy source, cached
NO_SPEC_ALIGN = ("needs vLLM's after-forward state copy of spec decodes (mamba_utils.py: postprocess_mamba_align_gpu), "
                 "which this runner does not mirror")


def aligned_chunk(start: int, n: int, prefill_end: int, block_size: int, max_tokens: int) -> int:
    """The tokens of a prefill chunk of `n` from `start` that the block alignment keeps
    (`_mamba_block_aligned_split`, without Eagle, connectors and prefill checkpoints):
    - past the prefill (a decode) nothing is clipped;
    - a chunk ending before `prefill_end` ends on the block boundary below its end, unless that is
      not past `start` and a block is wider than the step's budget (then it advances within the
      block); with a block that fits the budget such a chunk is clipped to nothing (0: it waits);
    - the prompt's last chunk is exempt, but no chunk runs past the next block boundary when it
      starts mid-block, nor past the last boundary before the prefill's last token
      (`get_mamba_prefill_checkpoint_position`: that state is the longest a later hit can use)."""
    if start >= prefill_end:
        return n
    end = start + n
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_tokens:
            end = aligned
    next_boundary = (start // block_size + 1) * block_size if start % block_size else 0
    last_cache = (prefill_end - 1) // block_size * block_size
    end = min((s for s in (next_boundary, last_cache) if start < s < end), default=end)
    return max(end - start, 0)


class BlockPool:
    """State blocks with reference counts, a free queue and a cache of filled blocks (module
    docstring). `blocks`: the pool, in the order the queue first hands them out."""

    def __init__(self, blocks):
        self.free: deque[int] = deque(blocks)
        self.refs: dict[int, int] = {}
        self.cached: dict[tuple, int] = {}  # tokens -> the block holding the state after them
        self.key_of: dict[int, tuple] = {}
        self.hits = 0  # requests started from a cached block

    def __len__(self) -> int:
        return len(self.free)

    def take(self) -> int:
        """The free queue's head, its cached state evicted (`BlockPool.get_new_blocks`)."""
        if not self.free:
            raise BadInput("no free state block (the pool is smaller than the requests it runs)")
        b = self.free.popleft()
        key = self.key_of.pop(b, None)
        if key is not None:
            del self.cached[key]
        self.refs[b] = 1
        return b

    def hold(self, b: int) -> None:
        """Another reference to a cached block (`BlockPool.touch`: out of the free queue if free)."""
        if self.refs.get(b, 0) == 0:
            self.free.remove(b)
        self.refs[b] = self.refs.get(b, 0) + 1

    def release(self, b: int) -> None:
        """Drop a reference; the last one puts the block at the free queue's tail, still cached."""
        self.refs[b] -= 1
        if self.refs[b] == 0:
            del self.refs[b]
            self.free.append(b)

    def cache(self, tokens: tuple, b: int) -> None:
        """`b` holds the state after `tokens` (the first one to is kept, as `cache_full_blocks`)."""
        if tokens not in self.cached and b not in self.key_of:
            self.cached[tokens] = b
            self.key_of[b] = tokens

    def longest_hit(self, tokens: list[int], block_size: int) -> tuple[int, int | None]:
        """(i, block) of the last cached block i of these tokens' full blocks, at most len-1 tokens
        (a request computes one token at least: `max_cache_hit_length = num_tokens - 1`), searched
        right to left (`find_longest_cache_hit`); (-1, None) without a hit."""
        for i in range((len(tokens) - 1) // block_size - 1, -1, -1):
            b = self.cached.get(tuple(tokens[:(i + 1) * block_size]))
            if b is not None:
                return i, b
        return -1, None


def check_block_size(block_size, spec_tokens: int) -> None:
    """Prefix caching's block size: None (mode "none"), or 1..MAX_BLOCK_SIZE tokens with K = 0."""
    if block_size is None:
        return
    if not isinstance(block_size, int) or isinstance(block_size, bool) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise BadInput(f"block_size {block_size!r} must be 1..{MAX_BLOCK_SIZE}")
    if spec_tokens:
        raise BadInput(f"block_size {block_size} with spec_tokens {spec_tokens}: prefix caching with drafts "
                       + NO_SPEC_ALIGN)


class AlignedBlocks:
    """The `Scheduler`'s steps with a block size (module docstring): admission from a prefix hit,
    each step's row of a request, and retiring the columns a step has moved past."""

    def _admit_aligned(self, r, hit: int, block: int | None) -> None:
        """Admission with a block size: from the cached block of its longest prefix hit, if any
        (`MambaManager.find_longest_cache_hit`: `[null]*i + [cached]`, (i+1)*block_size tokens
        computed), else from nothing; its running block is placed when its chunk is (`_place`)."""
        self._waiting.remove(r)
        r.target, r.num_computed, r.decodes, r.num_accepted = r.prefill_len(), 0, 0, 1
        r.cols, r.run_col = {}, -1
        if block is not None:
            self.pool.hold(block)
            self.pool.hits += 1
            r.cols[hit], r.num_computed = block, (hit + 1) * self.block_size
        self._running.append(r)

    def _place(self, r, q: int) -> None:
        """This step's row of a request with a block size: a block for the running column of
        seq_len = computed + scheduled (and the K after it) when it has none, the columns it holds,
        and the null block elsewhere; `prev` as the runner's `preprocess_mamba` finds it (a new or
        resumed request: `(num_computed - 1) // block_size`)."""
        bs, k = self.block_size, self.spec_tokens
        curr = running_column(r.num_computed + q, bs)
        r.prev = r.run_col if r.run_col >= 0 else running_column(r.num_computed, bs)
        for col in range(curr, curr + 1 + k):
            if col not in r.cols:
                r.cols[col] = self.pool.take()
        r.col = curr
        r.blocks = [r.cols.get(j, self.null) for j in range(curr + 1 + k)]

    def _retire(self, r) -> None:
        """After its step: the columns before the running one are let go (`remove_skipped_blocks`);
        a filled block stays cached in the pool until it is handed out again."""
        for col in [c for c in r.cols if c < r.col]:
            self.pool.release(r.cols.pop(col))
        r.run_col = r.col

    def _tokens(self, r, n: int) -> list[int]:
        return [self._tok(r, p) for p in range(n)]
