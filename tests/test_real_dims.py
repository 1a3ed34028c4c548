"""Islands at the real Qwen3.6-35B-A3B dimensions (synthetic weights in the real layout): they fit
and replay bit-exactly with real CUDA graphs. Generating the real-size layer takes ~40 s and
~8 GB on a CPU, so this runs on a GPU only."""
import pytest
import torch

from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case


@pytest.fixture(scope="module")
def real_model(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU (real-size layer: 256 experts, hidden 2048)")
    from repro.model.tiny import make_tiny
    path = make_tiny(tmp_path_factory.mktemp("real") / "real-layer", seed=0, preset="real-layer", device="cuda")
    p = make_provider("cuda")
    return Model(path, p.device), p


@pytest.mark.cuda
@pytest.mark.moe
@pytest.mark.parametrize("island, mode", [("chain", "piecewise"), ("chain", "full"), ("moe", "piecewise")])
def test_real_dims_replay_equals_eager(real_model, island, mode):
    model, provider = real_model
    assert model.cfg.hidden_size == 2048 and model.cfg.num_experts == 256
    r = run_case(model, provider, Case(island, mode), default_sequence(seed=0, steps=24, vocab=model.cfg.vocab_size))
    assert r.steps == 24 and not r.diverged, r.first_divergence
