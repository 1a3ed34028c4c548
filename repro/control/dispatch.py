"""Which graph a step replays: vLLM's uniform-decode decision, its capture sizes and its dispatcher.

- `uniform_decode`: `vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._is_uniform_decode`, as a
  rule of its own (`ControlRules.uniform_decode`): by shape (0.33.0's V1 runner), or the shape and
  every request past its prompt (vLLM PR #53059), or no uniform decode for a hybrid model's batch
  with a prefill (vLLM PR #47123), or no request in its prefill phase, a resumed request's
  recompute included (vLLM PR #51865, the V2 runner's form: the fixed stack's).
- `default_capture_sizes`: `vllm/config/vllm.py: VllmConfig._set_cudagraph_sizes`, the list a runner
  captures when none is configured (default performance mode, a platform ceiling of 512 tokens).
- `configured_sizes`: the same function's list when sizes are given: deduplicated, and without the
  sizes above the step budget (a step never holds more tokens, and vLLM drops them);
- `capture_sizes`: `CompilationConfig.adjust_cudagraph_sizes_for_spec_decode`: with a FULL decode
  mode and 1+k > 1, every size is rounded up to a multiple of 1+k, and sizes above the largest
  one asked for are dropped (the V1 runner only).
- `Dispatcher`: `vllm/v1/cudagraph_dispatcher.py: CudagraphDispatcher`, graphs keyed by
  `BatchDescriptor(num_tokens, num_reqs, uniform)`: a relaxed PIECEWISE key (num_reqs None, not
  uniform) for every capture size when the mixed mode is PIECEWISE, and uniform FULL keys for sizes
  x with 1+k <= x <= (1+k) * max_num_seqs (num_reqs = x // (1+k)) when the decode mode is FULL.
  `dispatch` pads to the smallest capture size that holds the step, tries the exact FULL key,
  then the relaxed PIECEWISE key, then runs eagerly (NONE) at the step's own size; above the
  largest capture size it is NONE.
- `dispatch_step`: one step as `GPUModelRunner._determine_batch_execution_and_padding` dispatches
  it, a dummy step as `_dummy_run(1+k, uniform_decode=True)`; on a data-parallel rank whose step
  names the other rank's batch (`StepBatch.dp_peer`), coordinated with it as
  `vllm/v1/worker/dp_utils.py: coordinate_batch_across_dp` does: the runtime mode is the lower of
  the two ranks' (NONE < PIECEWISE < FULL), and unless that is NONE both pad to the larger padded
  size, then dispatch again at it with only the agreed mode allowed. So an idle rank's dummy run,
  or a smaller rank's batch, runs at the busier rank's size, and a uniform decode beside a rank
  with a mixed batch replays pieces. Where the agreed mode is NONE this rank runs eagerly at its
  own size (vLLM runs an eager forward over its padded count: the padded rows no live row reads).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..knobs.options import UniformDecode
from ..knobs.modes import GraphMode, Runtime
from .shape import StepShape, decode_len

DEFAULT_SIZES = (1, 2, 4, 8, 16)  # vLLM's default list for 8 requests and a 16-token step budget at K = 0
PLATFORM_CEILING = 512  # `default_max_graph_size` (1024 only on compute capability 10.x)


def _grid(top: int) -> set[int]:
    """1, 2, 4, then steps of 8 below 256, then steps of 16, up to `top`."""
    return {n for n in (1, 2, 4) if n <= top} | set(range(8, min(top + 1, 256), 8)) | set(range(256, top + 1, 16))


def default_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, spec_tokens: int,
                          decode_sizes: bool = True) -> tuple[int, ...]:
    """`_set_cudagraph_sizes` with no sizes configured: the token grid up to
    min(max_num_seqs * (1+k) * 2, 512, the step budget), the step budget itself where it fits, and
    (`decode_sizes`, `ControlRules.decode_capture_sizes`: 0.33.0, not 0.26.0) the uniform-decode
    sizes n * (1+k) for request counts n on the same grid up to max_num_seqs (with k = 0:
    max_num_seqs alone), each within both ceilings. A FULL decode mode with k > 0 then rounds these
    (`capture_sizes`)."""
    q = decode_len(spec_tokens)
    ceiling = min(max_num_seqs * q * 2, PLATFORM_CEILING)
    if q > 1:
        reqs = min(max_num_seqs, PLATFORM_CEILING)
        decode = {n * q for n in _grid(reqs) | {reqs} if n * q <= ceiling}
    else:
        decode = {max_num_seqs} if max_num_seqs <= ceiling else set()
    if not decode_sizes:
        decode = set()
    ceiling = min(max_num_batched_tokens, ceiling)
    sizes = _grid(ceiling) | ({max_num_batched_tokens} if max_num_batched_tokens <= ceiling else set())
    return tuple(sorted(sizes | {s for s in decode if s <= max_num_batched_tokens}))


def configured_sizes(sizes, max_num_seqs: int, max_num_batched_tokens: int, spec_tokens: int,
                     decode_sizes: bool = True) -> tuple[int, ...]:
    """The capture list a runner starts from (`_set_cudagraph_sizes`): the sizes given, each at most
    the step budget, or with none given `default_capture_sizes` (`decode_sizes`: its rule's form)."""
    if sizes is None:
        return default_capture_sizes(max_num_seqs, max_num_batched_tokens, spec_tokens, decode_sizes)
    return tuple(sorted({s for s in sizes if s <= max_num_batched_tokens}))


def pad_size(n: int, sizes) -> int | None:
    """The smallest capture size that holds `n` rows (None: run eagerly)."""
    return next((s for s in sorted(sizes) if s >= n), None)


@dataclass(frozen=True)
class BatchDescriptor:
    """A graph's key (`vllm/forward_context.py: BatchDescriptor`, the fields this runner uses)."""
    num_tokens: int
    num_reqs: int | None = None  # None: the relaxed key a PIECEWISE graph is kept under
    uniform: bool = False

    def __str__(self) -> str:
        reqs = "" if self.num_reqs is None else f", {self.num_reqs} reqs"
        return f"{self.num_tokens} tokens{reqs}{', uniform' if self.uniform else ''}"


def prefilling(rule: UniformDecode, batch) -> list[bool]:
    """The requests a fixed form of the rule holds out of a uniform decode: PR #53059's and PR
    #47123's, each request before its prompt's end (`num_computed_tokens < num_prompt_tokens`);
    PR #51865's (`vllm/v1/worker/gpu/model_runner.py: GPUModelRunner.gather_batch_req_state`, the
    V2 runner), each in its prefill phase (`num_computed_prefill_tokens <
    prefill_len`, a resumed request's recompute included) unless its row is one new token over
    existing context."""
    if rule is not UniformDecode.PHASE_AWARE:
        return batch.is_prefilling()
    return [c < p and not (q - d == 1 and c > 0)
            for c, p, q, d in zip(batch.computed(), batch.prefills(), batch.query_lens, batch.drafts())]


def uniform_decode(rule: UniformDecode, query_lens, prefilling, spec_tokens: int) -> bool:
    """`GPUModelRunner._is_uniform_decode` and its fixed forms (module docstring): the largest
    query is 1+k and the token count is that times the request count; `prefilling[i]`: request i
    is held out by the rule's fixed form (`prefilling`). The model is hybrid (GDN layers), so PR
    #47123's rule is the past-prompt test here too."""
    if not query_lens:
        return False
    q = decode_len(spec_tokens)
    shape = max(query_lens) == q and sum(query_lens) == q * len(query_lens)
    if rule is UniformDecode.SHAPE:
        return shape
    return shape and not any(prefilling)


def capture_sizes(sizes, mode: GraphMode, spec_tokens: int) -> tuple[int, ...]:
    """The capture sizes the runner uses (`adjust_cudagraph_sizes_for_spec_decode`, module docstring)."""
    sizes = tuple(sorted(set(sizes)))
    q = decode_len(spec_tokens)
    if mode.decode is not Runtime.FULL or q == 1 or not sizes:
        return sizes
    top = max(sizes)
    rounded = sorted({-(-s // q) * q for s in sizes if -(-s // q) * q <= top})
    return tuple(rounded) if rounded else ((q,) if q <= top else ())


class Dispatcher:
    """The graph keys one runner holds and the key each step replays (module docstring), for a step
    shape's K and `max_num_seqs`; `sizes`: the capture list before the spec rounding."""

    def __init__(self, mode: GraphMode, sizes, shape: StepShape):
        self.mode, self.shape = mode, shape
        self.q, self.max_num_seqs = shape.decode_len, shape.max_num_seqs
        self.sizes = capture_sizes(sizes, mode, shape.spec_tokens)
        self.keys: dict[BatchDescriptor, Runtime] = {}
        if mode.mixed is not Runtime.NONE:
            for s in self.sizes:
                key = BatchDescriptor(s) if mode.mixed is Runtime.PIECEWISE else BatchDescriptor(s, min(s, self.max_num_seqs))
                self.keys[key] = mode.mixed
        if mode.decode is Runtime.FULL and mode.separate_routine:
            for s in self.sizes:
                if self.q <= s <= self.q * self.max_num_seqs and s % self.q == 0:
                    self.keys[BatchDescriptor(s, min(s // self.q, self.max_num_seqs), True)] = Runtime.FULL

    def padded(self, num_tokens: int, uniform: bool) -> BatchDescriptor | None:
        """`CudagraphDispatcher._create_padded_batch_descriptor`."""
        size = pad_size(num_tokens, self.sizes)
        if size is None:
            return None
        if uniform and self.mode.separate_routine and self.mode.decode is Runtime.FULL:
            return BatchDescriptor(size, min(size // self.q, self.max_num_seqs), True)
        return BatchDescriptor(size, min(size, self.max_num_seqs), False)

    def dispatch(self, num_tokens: int, uniform: bool, allowed=tuple(Runtime)) -> tuple[Runtime, BatchDescriptor]:
        """`CudagraphDispatcher.dispatch`: (runtime mode, the key), or (NONE, the step unpadded);
        `allowed`: its `valid_modes`."""
        eager = (Runtime.NONE, BatchDescriptor(num_tokens))
        if not self.keys:
            return eager
        desc = self.padded(num_tokens, uniform)
        if desc is None:
            return eager
        if Runtime.FULL in allowed and self.keys.get(desc) is Runtime.FULL:
            return Runtime.FULL, desc
        relaxed = replace(desc, num_reqs=None, uniform=False)
        if Runtime.PIECEWISE in allowed and self.keys.get(relaxed) is Runtime.PIECEWISE:
            return Runtime.PIECEWISE, relaxed
        return eager

    def coordinate(self, own: tuple[Runtime, BatchDescriptor], num_tokens: int, uniform: bool,
                   peer) -> tuple[Runtime, BatchDescriptor]:
        """`own` (this rank's dispatch of `num_tokens`) agreed with the other data-parallel rank's
        batch `peer` = (num_tokens, uniform; 0 tokens: it is idle and runs a dummy step), as
        `coordinate_batch_across_dp` and the re-dispatch after it do (module docstring)."""
        tokens, peer_uniform = (peer[0], bool(peer[1])) if peer[0] else (self.q, True)
        theirs = self.dispatch(tokens, peer_uniform)
        agreed = min(own[0], theirs[0])
        if agreed is Runtime.NONE:
            return Runtime.NONE, BatchDescriptor(num_tokens)
        size = max(own[1].num_tokens, theirs[1].num_tokens)
        return self.dispatch(size, uniform, (agreed,))


def dispatch_step(dispatcher: Dispatcher, batch, rule: UniformDecode) -> tuple[Runtime, BatchDescriptor]:
    """How a runner dispatches one step (module docstring): a dummy step as a uniform decode of 1+k
    tokens, any other by `rule`'s uniform-decode decision, each coordinated with the other
    data-parallel rank's batch when the step names it."""
    if batch.dummy:
        tokens, uniform = dispatcher.q, True
    else:
        tokens, uniform = batch.num_tokens, uniform_decode(rule, batch.query_lens, prefilling(rule, batch),
                                                           dispatcher.shape.spec_tokens)
    own = dispatcher.dispatch(tokens, uniform)
    peer = getattr(batch, "dp_peer", None)
    return own if peer is None else dispatcher.coordinate(own, tokens, uniform, peer)
