"""The chain under the B70's fused GDN core (`REPRO_KERNELS=gdn=xpu_semantics`), beside the default
providers: what a padded FULL replay writes, and each record hazard whose outcome differs, with
both outcomes stated. Short seeded sequences on the CPU tape."""
import pytest
import torch

from kernels import registry
from repro.control.dispatch import default_capture_sizes
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, plan, run_case
from repro.job.results import verdict
from repro.knobs import hazards as hz
from repro.lockstep.lockstep import Lockstep
from repro.scheduler.sequence import Request, Sequence
from repro.control.shape import StepShape

SEQ = default_sequence(seed=0, steps=30)
FUSED = {"gdn": "xpu_semantics"}


@pytest.fixture(scope="module")
def setup(tiny_path):
    provider = make_provider("cpu")
    return Model(tiny_path, provider.device), provider


def full_lockstep(model, provider) -> Lockstep:
    """A FULL-mode chain lockstep over SEQ, no hazard, run to its end."""
    ls = Lockstep(lambda o: model.copy(o, num_slots=SEQ.copy_slots(), sentinel=0), provider, "full",
                  hz.options_for((), ()), StepShape(0, SEQ.num_slots, SEQ.max_tokens,
                                                    default_capture_sizes(SEQ.num_slots, SEQ.max_tokens, 0)))
    assert ls.run(SEQ.batches()) is None  # clean: the null block is no request's state
    return ls


def test_a_padded_full_replay_writes_the_null_block_under_the_xpu_rules_only(setup):
    """A FULL decode graph replayed for fewer requests than it was captured for pads its rows onto the
    null block (vLLM's NULL_BLOCK_ID 0). The default providers skip index 0, so block 0 stays as it
    was; vllm-xpu-kernels skips only -1 and the padded tokens belong to the last (padded) row, so the
    replay writes block 0's conv window. No request owns block 0: both runs are clean."""
    with registry.using(**FUSED):
        ls = full_lockstep(*setup)
    assert ls.null_written is not None and ls.graph.replays > 0
    conv_e, conv_r = ls.eager_copy.cache.conv, ls.replay_copy.cache.conv
    assert not torch.equal(conv_e[0], conv_r[0])
    assert torch.equal(conv_e[1:], conv_r[1:]) and torch.equal(ls.eager_copy.cache.ssm, ls.replay_copy.cache.ssm)
    default = full_lockstep(*setup)
    assert default.null_written is None
    assert torch.equal(default.eager_copy.cache.conv[0], default.replay_copy.cache.conv[0])


def test_pad_sentinel_mismatch_is_refused_under_the_xpu_rules_and_detected_by_the_default_providers(setup):
    """vLLM #35431/#39064's hazard runs the kernels with sentinel -1. The default providers skip -1 and
    see the runner's 0-padding corrupt live block 0 (detected); the XPU recurrence takes every index
    unchecked, so the capture's -1 rows would read and write ssm_state[-1], outside the cache: the
    run refuses the case, as its plan expects, and its repair's too (the repair pads with -1)."""
    model, provider = setup
    h = "pad-sentinel-mismatch"
    default = run_case(model, provider, Case("chain", "full", (h,), expect="diverged"), SEQ)
    assert verdict(default) == "detected" and not default.refused
    with registry.using(**FUSED):
        planned = plan("chain", "full", (h,), (), False) + plan("chain", "full", (h,), ("sanitize-pad",), False)
        assert [c.expect for c in planned] == ["refused", "refused"]
        fused = [run_case(model, provider, c, SEQ) for c in planned]
    assert [verdict(r) for r in fused] == ["refused", "refused"]
    assert all("ssm_state[-1]" in r.refused for r in fused)
    assert plan("chain", "full", (h,), (), False)[0].expect == "diverged"  # default providers: the hazard's own


def test_the_undeclared_mutation_hazard_hides_the_fused_cores_state_writes(setup):
    """Under the fused core the hazard's op is the whole core declaring only its output (as vLLM
    declares `gdn_attention_core_xpu`); the lint names it and the states it writes undeclared."""
    model, provider = setup
    with registry.using(**FUSED):
        r = run_case(model, provider, Case("chain", "piecewise", ("undeclared-mutation",), expect="finding"), SEQ)
    found = [f["detail"] for f in r.findings if f["kind"] == "undeclared-mutation"]
    assert verdict(r) == "detected" and any("gdn_attention_undeclared" in d and "ssm_state" in d for d in found)


def test_53051_loses_the_prompts_output_by_default_and_its_state_into_the_null_block_under_the_xpu_rules(setup):
    """vLLM #53051's minimal trigger (a 3-token prompt at k = 2, replayed through the FULL decode graph
    whose spec buffers hold the capture's null indices). Default providers: the kernels skip index 0,
    so the prompt's output is never written (the first divergence is its core output row). Under
    vllm-xpu-kernels' rules the spec kernels run the row on block 0: at the first step block 0 still
    holds zeros, the start a new prompt has, so the output is right, but every column's state goes
    to the null block and the request's own block 1 is never written (its next decode starts from
    it); a later prompt hitting the bug would start from what this one left in block 0."""
    model, provider = setup
    seq = Sequence([Request(0, 3, 0)], num_slots=16, spec_tokens=2)
    case = Case("chain", "full", ("shape-only-uniform-decode",), expect="diverged", spec_tokens=2)
    default = run_case(model, provider, case, seq).divergence
    with registry.using(**FUSED):
        fused = run_case(model, provider, case, seq).divergence
    assert (default.step, default.island, default.tensor, default.request) == (0, "gdn_core", "core_out", 0)
    assert default.damage["null_written"] is None and 0 not in default.damage["blocks"]
    assert (fused.step, fused.island, fused.tensor, fused.slot) == (0, "gdn_core", "conv_state", 1)
    assert fused.damage["blocks"] == [0, 1] and fused.damage["null_written"] == 0 and fused.damage["live"]
