"""The GDN builder's staging limit, as vLLM's: it copies a batch of spec rows into the buffers its
FULL decode graphs read only when both the spec-row count and the spec-token count are at most
`decode_cudagraph_max_bs` = min(max_num_seqs * (1+K), the largest capture size after the spec
rounding) (`vllm/v1/attention/backends/gdn_attn.py: GDNAttentionMetadataBuilder.__init__` sizes it,
`_stage_spec_decode` applies it; the V1 runner builds the builders after
`_check_and_update_cudagraph_mode` has rounded the sizes). A batch over the limit gets fresh tensors,
and a later FULL replay that does not re-stage reads what the last staged batch left: the situation
the stale-buffer hazards hunt. The runner sizes its builder so, and the generated script's builder
stages as the suite's (`tests/test_standalone_*` compare the two)."""
import numpy as np
import pytest

from repro.capture.runner import GraphRunner
from repro.control.builder import Common
from repro.graphs import make_provider
from repro.islands import Model
from repro.control.shape import StepShape
from tests.scripts import template_module


@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(tiny_path, "cpu")


def spec_rows(blocks, k=2) -> Common:
    """A batch of spec decodes, one a row of `blocks` (1+K state blocks each), each with K drafts."""
    n, q = len(blocks), 1 + k
    lens = np.full(n, q, dtype=np.int32)
    return Common(lens, np.full(n, 9, dtype=np.int32), np.zeros(n, dtype=bool), np.full(n, k, dtype=np.int32),
                  np.full(n, 2, dtype=np.int32), np.asarray(blocks, dtype=np.int32), n * q)


def test_sizes_1_2_4_8_at_k2_with_8_sequences_stage_at_most_6_tokens(model):
    """vLLM rounds [1, 2, 4, 8] to [3, 6] for K = 2, so its limit is min(8 * 3, 6) = 6: a 2-row spec
    step (6 tokens) is staged, a 3-row one (9 tokens) is not, and the buffers keep the 2-row step's
    rows, where a mirror sized max(max_num_seqs, largest size) rows would have staged it."""
    runner = GraphRunner(model.copy(num_slots=8, spec_tokens=2), make_provider("cpu"), mode="full_and_piecewise",
                         shape=StepShape(2, 8, sizes=(1, 2, 4, 8)))
    b = runner.path.builder
    assert runner.sizes == (3, 6) and b.max_rows == 6
    two = b.build(spec_rows([[1, 2, 3], [4, 5, 6]]))
    assert two.spec_state_indices.data_ptr() == b.spec_state_indices.data_ptr()  # staged: a view of the buffer
    three = b.build(spec_rows([[7, 8, 9], [10, 11, 12], [13, 14, 15]]))
    assert three.spec_state_indices.data_ptr() != b.spec_state_indices.data_ptr()  # fresh: not staged
    assert b.spec_state_indices[:2].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert b.spec_query_start_loc[:3].tolist() == [0, 3, 6] and b.num_accepted_tokens[:2].tolist() == [2, 2]


@pytest.mark.parametrize("seqs, budget, rows", [(64, 64, 19), (256, 8192, 168)])
def test_with_vllms_default_sizes_the_limit_is_the_largest_rounded_size(model, seqs, budget, rows):
    """64 sequences and a 64-token budget at K = 2: vLLM's default list rounds to at most 57, so 19
    spec rows are staged and 20 are not; 256 sequences and 8192 tokens: 504, 168 rows."""
    runner = GraphRunner(model.copy(num_slots=4, spec_tokens=2), make_provider("cpu"), mode="full_and_piecewise",
                         shape=StepShape(2, seqs, budget))
    b = runner.path.builder
    assert b.max_rows == max(runner.sizes) == 3 * rows
    blocks = [[3 * i + 1, 3 * i + 2, 3 * i + 3] for i in range(rows + 1)]
    assert b.build(spec_rows(blocks[:rows])).spec_state_indices.data_ptr() == b.spec_state_indices.data_ptr()
    assert b.build(spec_rows(blocks)).spec_state_indices.data_ptr() != b.spec_state_indices.data_ptr()


def test_the_generated_scripts_builder_has_the_same_limit(model):
    """The template's builder, sized as its runner sizes it, stages the 2-row step and not the 3-row one."""
    t = template_module("template_staging")
    b = t.MetadataBuilder(2, min(8 * 3, max(t.capture_sizes((1, 2, 4, 8), True, 2))), "cpu", True, 0, "is-prefilling")
    st = lambda n: {"query_lens": [3] * n, "draft_lens": [2] * n, "num_computed": [9] * n, "prompt_lens": [1] * n,
                    "num_accepted": [2] * n, "blocks": [[3 * i + 1, 3 * i + 2, 3 * i + 3] for i in range(n)],
                    "token_ids": [0] * (3 * n)}
    assert b.build(st(2), 2)["spec_state_indices"].data_ptr() == b.spec_state_indices.data_ptr()
    assert b.build(st(3), 3)["spec_state_indices"].data_ptr() != b.spec_state_indices.data_ptr()
    assert b.spec_state_indices[:2].tolist() == [[1, 2, 3], [4, 5, 6]]
