"""Block-aligned prefix caching of GDN state, the scheduler's side (vLLM's mamba cache mode "align").

Column j of a request's block-table row holds the state after exactly (j+1)*block_size tokens
(`control.prefix` has the runner's side). For that to hold, the scheduler

- ends a prefill chunk on a block boundary unless it is the prompt's last
  (`aligned_chunk`, `vllm/v1/core/sched/scheduler.py: Scheduler._mamba_block_aligned_split`);
- gives a request a block for its running column when the column moves and one for each of the K
  speculative columns after it, moving last step's speculative blocks that the window left behind
  forward instead of taking new ones (`vllm/v1/core/single_type_kv_cache_manager.py:
  MambaManager.allocate_new_blocks`, `_relocate_speculative_block`);
- keeps the previous running block for the step that copies from it, and lets a block go once the
  tokens kept have moved past it (`MambaManager.remove_skipped_blocks`: everything before the
  block of the last kept token);
- with drafts, saves the state at a block boundary the kept tokens crossed into that boundary's
  block after the step (`vllm/v1/worker/mamba_utils.py: postprocess_mamba_align_gpu`, the
  decision of `postprocess_mamba_fused_kernel`): the scheduler knows a step's kept counts only
  when the next one is scheduled, so that copy rides on the next step (`post_copies`), ahead of
  its forward copies, which is where it falls in vLLM's order of state writes too;
- caches every block the kept tokens have filled under the tokens it covers (`MambaManager.
  cache_blocks`: a block let go before is the null block and is not cached), and starts a new
  request from the longest cached prefix of its tokens (`MambaManager.find_longest_cache_hit`).

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
from ..control.shape import decode_len

MAX_BLOCK_SIZE = 1024
ALIGN_BLOCKS = 3  # state blocks a request slot adds to the pool with a block size: running, copy source, cached


def aligned_chunk(start: int, n: int, num_tokens: int, block_size: int, max_tokens: int,
                  num_prompt: int | None = None, junction: int = 0) -> int:
    """The tokens of a prefill chunk of `n` from `start` that the block alignment keeps
    (`_mamba_block_aligned_split`, without Eagle, connectors and prefill checkpoints), for a request
    holding `num_tokens` tokens of which `num_prompt` are its prompt (None: all, a first prefill);
    the prefill ends at `max(num_prompt, num_tokens - 1)` (a resumed request's last token is its last
    sampled one, which the recompute's last chunk runs as a prompt's last chunk would):
    - past the prefill (a decode) nothing is clipped;
    - a chunk ending before the prefill's end ends on the block boundary below its end, unless that
      is not past `start` and a block is wider than the step's budget (then it advances within the
      block); with a block that fits the budget such a chunk is clipped to nothing (0: it waits);
    - the prefill's last chunk is exempt, but no chunk runs past the next block boundary when it
      starts mid-block, nor past the last boundary before the request's last token
      (`get_mamba_prefill_checkpoint_position`: that state is the longest a later hit can use), nor
      past the block boundary at or below a shared prefix's `junction` (`BlockPool.shared`) from
      `start`, so the state there is cached for the requests that share it."""
    prefill_end = num_tokens if num_prompt is None else max(num_prompt, num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_tokens:
            end = aligned
    next_boundary = (start // block_size + 1) * block_size if start % block_size else 0
    last_cache = (num_tokens - 1) // block_size * block_size
    shared = start + (junction - start) // block_size * block_size if start < junction < end else 0
    end = min((s for s in (next_boundary, last_cache, shared) if start < s < end), default=end)
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
        self.seen: set[tuple] = set()  # every full block of tokens computed: what the attention layers cache

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

    def shared(self, tokens: list[int], block_size: int) -> int:
        """The tokens of the longest run of these tokens' full blocks that some request computed, at
        most len-1 (the attention layers' cache hit: they cache every full block, where the state
        layers cache only the blocks chunks end on; `KVCacheManager.get_computed_blocks` calls it
        the `shared_prefix_boundary` where it is longer than the state hit)."""
        n = 0
        while (n + 1) * block_size <= len(tokens) - 1 and tuple(tokens[:(n + 1) * block_size]) in self.seen:
            n += 1
        return n * block_size

    def longest_hit(self, tokens: list[int], block_size: int) -> tuple[int, int | None]:
        """(i, block) of the last cached block i of these tokens' full blocks, at most len-1 tokens
        (a request computes one token at least: `max_cache_hit_length = num_tokens - 1`), searched
        right to left (`find_longest_cache_hit`); (-1, None) without a hit."""
        for i in range((len(tokens) - 1) // block_size - 1, -1, -1):
            b = self.cached.get(tuple(tokens[:(i + 1) * block_size]))
            if b is not None:
                return i, b
        return -1, None


def check_block_size(block_size, spec_tokens: int, names=("block_size", "spec_tokens")) -> None:
    """Prefix caching's block size: None (mode "none"), or 1..MAX_BLOCK_SIZE tokens, wider than the
    K draft tokens, so a decode's 1+K tokens cross one block boundary at most (vLLM's mamba blocks
    are hundreds of tokens: `vllm/platforms/xpu.py: update_block_size_for_backend` rounds them to a
    multiple of 64; where more are crossed, `postprocess_mamba_fused_kernel` saves the last only).
    `names`: what the refusal calls the two (the JSON's fields, or the command line's flags)."""
    if block_size is None:
        return
    if not isinstance(block_size, int) or isinstance(block_size, bool) or not 1 <= block_size <= MAX_BLOCK_SIZE:
        raise BadInput(f"{names[0]} {block_size!r} must be 1..{MAX_BLOCK_SIZE}")
    if block_size <= spec_tokens:
        raise BadInput(f"{names[0]} {block_size} with {names[1]} {spec_tokens}: a block must be wider than the "
                       "draft tokens (a decode may then cross one block boundary at most)")


def saved_boundary(computed: int, kept: int, block_size: int) -> tuple[int, int] | None:
    """After a spec decode of a request with `computed` tokens before it that kept `kept` of its
    1+K tokens: (token offset in the step's window, column) of the block boundary to save, or None.
    `postprocess_mamba_fused_kernel`: the running state covers computed+1 tokens, the kept tokens
    reach computed+kept; the last block boundary `aligned` at or below that, if the step reached
    it, holds the state after `aligned` tokens: the window's token aligned-(computed+1) (its
    column, and the conv window from there), into column aligned // block_size - 1."""
    running, new = computed + 1, computed + kept
    aligned = new // block_size * block_size
    if aligned < running:
        return None
    return aligned - running, aligned // block_size - 1


class AlignedBlocks:
    """The `Scheduler`'s steps with a block size (module docstring): admission from a prefix hit,
    each step's row of a request, and retiring the columns a step has moved past."""

    def _admit_aligned(self, r, hit: int, block: int | None) -> None:
        """Admission with a block size: from the cached block of its longest prefix hit, if any
        (`MambaManager.find_longest_cache_hit`: `[null]*i + [cached]`, (i+1)*block_size tokens
        computed), else from nothing; its running block is placed when its chunk is (`_place`)."""
        self._waiting.remove(r)
        r.target, r.num_computed, r.decodes, r.num_accepted = r.prefill_len(), 0, 0, 1
        r.cols, r.run_col, r.cached = {}, -1, 0
        if block is not None:
            self.pool.hold(block)
            self.pool.hits += 1
            r.cols[hit], r.num_computed, r.cached = block, (hit + 1) * self.block_size, hit + 1
        self._running.append(r)

    def _place(self, r, q: int) -> None:
        """This step's row of a request with a block size: a block for the running column of
        seq_len = computed + scheduled (and the K after it) when it has none, the columns it holds,
        and the null block elsewhere; `prev` as the runner's `preprocess_mamba` finds it (a new or
        resumed request: `(num_computed - 1) // block_size`)."""
        bs, k = self.block_size, self.spec_tokens
        curr = running_column(r.num_computed + q, bs)
        r.prev = r.run_col if r.run_col >= 0 else running_column(r.num_computed, bs)
        # last step's speculative blocks behind the new running column move into the new window
        # (`_relocate_speculative_block`: scratch blocks, never cached), before any new block
        moved = [r.cols.pop(j) for j in range(r.run_col + 1, r.run_col + decode_len(k)) if j < curr and j in r.cols] \
            if r.run_col >= 0 else []
        for col in range(curr, curr + decode_len(k)):
            if col not in r.cols:
                r.cols[col] = moved.pop(0) if moved else self.pool.take()
        assert not moved, "a window needs as many new blocks as speculative ones it left behind, plus one"
        r.col = curr
        r.blocks = [r.cols.get(j, self.null) for j in range(curr + decode_len(k))]

    def _retire(self, r, kept: int) -> None:
        """The columns before the block of the last of `kept` tokens are let go, all but the
        running one (`remove_skipped_blocks`: only the last kept token's state is needed); a
        filled block stays cached in the pool until it is handed out again."""
        for col in [c for c in r.cols if c < running_column(kept, self.block_size) and c != r.col]:
            self.pool.release(r.cols.pop(col))
        r.run_col = r.col

    def _cache_kept(self, r, kept: int) -> None:
        """Cache each block the first `kept` tokens fill that this request has not cached yet and
        still holds (`MambaManager.cache_blocks`: a block let go is the null block, skipped)."""
        for j in range(r.cached, kept // self.block_size):
            key = tuple(self._tokens(r, (j + 1) * self.block_size))
            self.pool.seen.add(key)
            if j in r.cols:
                self.pool.cache(key, r.cols[j])
                self._fresh.add(self.pool.cached[key])  # its key's block, cached this step
        r.cached = max(r.cached, kept // self.block_size)

    def _settle_aligned(self, r, computed: int, kept: int) -> None:
        """A running request's spec decode kept `kept` tokens: its boundary state saved, then the
        columns behind the last kept token let go."""
        self._post_align(r, computed, kept)
        self._retire(r, computed + kept)

    def _post_align(self, r, computed: int, kept: int) -> None:
        """After a spec decode that kept `kept` tokens: the boundary state it reached saved into
        its column (`saved_boundary`), queued for the next step (`post_copies`); a copy into the
        running column itself leaves the next step reading it from its start (accepted 1), as the
        kernel writes `num_accepted_tokens_out`."""
        at = saved_boundary(computed, kept, self.block_size)
        if at is None:
            return
        bias, dest = at
        if dest == r.col:
            r.num_accepted = 1
            if bias == 0:
                return  # the state is where it belongs (the kernel's no-op self-copy)
        self._post.append([r.cols[dest], r.cols[r.col], bias, r.cols[r.col + bias]])

    def _take_post(self) -> list[list[int]]:
        post, self._post = self._post, []
        return post

    def _tokens(self, r, n: int) -> list[int]:
        return [self._tok(r, p) for p in range(n)]
