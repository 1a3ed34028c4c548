"""Two rules of vLLM's V1 model runner (`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner`) behind
the mirror's calls (`repro.control.dispatch.uniform_decode`, `repro.control.builder.draft_counts`).

- `uniform_decode`: `GPUModelRunner._is_uniform_decode`, a staticmethod, called as
  `_determine_batch_execution_and_padding` calls it.
- `draft_counts`: the draft bookkeeping of `GPUModelRunner._prepare_inputs` (each row's
  `num_decode_draft_tokens`: its draft count where its query is its drafts plus one token, else -1,
  and in 0.33.0 a one-token decode with no drafts 0). The runner itself cannot be built here (it
  makes CUDA streams, and `_prepare_inputs` launches a Triton slot-mapping kernel), so the lines that
  compute it are cut from the installed wheel's source between the release's two anchors
  (`v0_33.DRAFT_BOOKKEEPING`) and run as they stand, on the batch's arrays in the attributes they
  read (`self.input_batch.req_id_to_index`, `.num_computed_tokens_cpu`, `.num_prompt_tokens`,
  `scheduler_output.scheduled_spec_decode_tokens`). Anchors that are not found fail loudly: the
  wheel is not the one this seam was written against.
"""
from __future__ import annotations

import functools
import inspect
import textwrap
import types

import numpy as np
from ..control.shape import decode_len


def uniform_decode(up, query_lens, spec_tokens: int) -> bool:
    """`GPUModelRunner._is_uniform_decode` of one step's queries (the mirror's SHAPE rule)."""
    q = [int(x) for x in query_lens]
    return bool(up.gpu_model_runner.GPUModelRunner._is_uniform_decode(
        max_num_scheduled_tokens=max(q), uniform_decode_query_len=decode_len(spec_tokens), num_tokens=sum(q),
        num_reqs=len(q)))


@functools.lru_cache(maxsize=None)
def _bookkeeping(method, anchors: tuple[str, str]):
    """The lines of `method` from the first anchor up to the second, as a function of the names
    they read, returning `num_decode_draft_tokens`."""
    lines = inspect.getsource(method).splitlines()
    start = next((i for i, x in enumerate(lines) if x.strip() == anchors[0]), None)
    stop = next((i for i, x in enumerate(lines) if start is not None and i > start and x.strip() == anchors[1]), None)
    if start is None or stop is None:
        raise RuntimeError(f"{method.__qualname__}: the draft bookkeeping's anchors {anchors} are not in this "
                           "vLLM's source (a release this seam was not written against)")
    body = textwrap.indent(textwrap.dedent("\n".join(lines[start:stop])), "    ")
    src = ("def bookkeeping(self, scheduler_output, num_scheduled_tokens, num_reqs, np):\n"
           f"{body}\n    return num_decode_draft_tokens\n")
    scope: dict = {}
    exec(compile(src, f"<{method.__qualname__}: draft bookkeeping>", "exec"), scope)
    return scope["bookkeeping"]


def draft_counts(up, query_lens, drafts, computed, prompts) -> np.ndarray:
    """`num_decode_draft_tokens` of one step (module docstring): rows in batch order, `drafts` the
    draft tokens scheduled for each (a request with none has no entry, as the scheduler sends it)."""
    n = len(query_lens)
    rids = [str(i) for i in range(n)]
    batch = types.SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(rids)},
                                  num_computed_tokens_cpu=np.asarray(computed, dtype=np.int32),
                                  num_prompt_tokens=np.asarray(prompts, dtype=np.int32))
    out = types.SimpleNamespace(scheduled_spec_decode_tokens={r: [0] * int(d) for r, d in zip(rids, drafts) if d > 0})
    fn = _bookkeeping(up.gpu_model_runner.GPUModelRunner._prepare_inputs, up.draft_anchors)
    return fn(types.SimpleNamespace(input_batch=batch), out, np.asarray(query_lens, dtype=np.int32), n, np)
