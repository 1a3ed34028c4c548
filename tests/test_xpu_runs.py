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

SEQ = default_sequence(seed=0, steps=30)
FUSED = {"gdn": "xpu_semantics"}


@pytest.fixture(scope="module")
def setup(tiny_path):
    provider = make_provider("cpu")
    return Model(tiny_path, provider.device), provider


def full_lockstep(model, provider) -> Lockstep:
    """A FULL-mode chain lockstep over SEQ, no hazard, run to its end."""
    ls = Lockstep(lambda o: model.copy(o, num_slots=SEQ.copy_slots(), sentinel=0), provider, "full",
                  hz.options_for((), ()), default_capture_sizes(SEQ.num_slots, SEQ.max_tokens, 0), SEQ.max_tokens,
                  max_num_seqs=SEQ.num_slots)
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
