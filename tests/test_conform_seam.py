"""The seam to vLLM's own code (`repro/upstream/`): the suite stays torch-only without it, every
version-specific trick lives in its release's module, and with vLLM installed a case becomes a real
`VllmConfig` (and a V1 scheduler) that vLLM's classes run on."""
import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro.upstream import load as upstream
from repro.upstream.case import Case

ROOT = Path(__file__).resolve().parents[1]
MISSING = upstream.why_not()
needs_vllm = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
MODULE_PATH = re.compile(r"^vllm(\.\w+)+$")


def _vllm_imports(path: Path) -> list[str]:
    """Imports of vLLM in a file: import statements, and module paths written as strings."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] == "vllm"]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm" and not node.level:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_PATH.match(node.value):
            found.append(node.value)
    return found


def test_only_a_release_module_of_the_seam_names_a_vllm_module():
    found = {str(p.relative_to(ROOT)): _vllm_imports(p) for p in (ROOT / "repro").rglob("*.py")}
    allowed = {f"repro/upstream/v{v.replace('.', '_')[:-2]}.py" for v in upstream.RELEASES}
    assert allowed == {"repro/upstream/v0_33.py", "repro/upstream/v0_26.py"}
    assert {p for p, names in found.items() if names} <= allowed
    assert "vllm.v1.worker.gpu_model_runner" in found["repro/upstream/v0_33.py"]


def test_the_checker_sees_an_import_of_vllm(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("import vllm.config\nfrom vllm.v1 import x\nm = 'vllm.v1.worker.block_table'\ns = 'vllm 0.33.0'\n")
    assert _vllm_imports(f) == ["vllm.config", "vllm.v1", "vllm.v1.worker.block_table"]


def test_importing_the_package_and_the_seam_needs_no_vllm():
    code = ("import sys, repro, repro.cli.app, repro.upstream, repro.upstream.load, repro.upstream.config, "
            "repro.upstream.dispatch, repro.upstream.builder, repro.upstream.runner, repro.upstream.input_batch; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_without_vllm_the_seam_says_which_tox_environment_has_it(monkeypatch):
    monkeypatch.setattr(upstream, "installed", lambda: None)
    assert upstream.why_not() == "vLLM is not installed (its control path runs in `tox -e vllm033`, `tox -e vllm026`)"
    monkeypatch.setattr(upstream, "installed", lambda: "0.30.0")
    assert "vLLM 0.30.0 is installed; the seam knows 0.33.0, 0.26.0" in upstream.why_not()
    upstream.load.cache_clear()
    with pytest.raises(upstream.UpstreamMissing, match="0.30.0"):
        upstream.load()
    upstream.load.cache_clear()


def test_each_release_has_its_pinned_list_and_tox_environment():
    tox = (ROOT / "tox.ini").read_text()
    for v in upstream.RELEASES:
        req = (ROOT / upstream.REQUIREMENTS[v]).read_text()
        assert f"vllm=={v}\n" in req and "triton" not in req.lower().replace("never add triton", "")
        assert not re.search(r"^kernels==", req, re.M)  # HF's package would shadow this repository's kernels/
        assert f"[testenv:{upstream.TOX_ENV[v]}]" in tox and upstream.REQUIREMENTS[v] in tox


@pytest.mark.conformance
@needs_vllm
@pytest.mark.parametrize("folder", [False, True], ids=["embedded", "make-tiny"])
def test_a_case_becomes_a_real_vllm_config(folder, tiny_path, cache):
    from repro.upstream.config import vllm_config
    from repro.upstream.dispatch import Dispatcher
    up = upstream.load()
    case = Case(mode="full", spec_tokens=2, sizes=(1, 2, 4, 8), max_num_seqs=6, max_num_batched_tokens=40,
                block_size=4, checkpoint=Path(tiny_path) if folder else None, cache=cache)
    cfg = vllm_config(up, case)
    assert type(cfg).__name__ == "VllmConfig" and cfg.model_config.model == str(case.model_path())
    assert (cfg.scheduler_config.max_num_seqs, cfg.scheduler_config.max_num_batched_tokens) == (6, 40)
    assert cfg.num_speculative_tokens == 2 and cfg.cache_config.mamba_cache_mode == "align"
    assert (cfg.cache_config.block_size, cfg.cache_config.mamba_block_size) == (4, 4)
    assert cfg.model_config.hf_text_config.layer_types[:4] == ["linear_attention"] * 3 + ["full_attention"]
    d = Dispatcher(up, cfg)  # FULL resolves for GDN as the runner resolves it, sizes rounded to 1+K
    assert d.mode.name == "FULL_AND_PIECEWISE" and d.asked == (1, 2, 4, 8) and d.sizes == (3, 6)


@pytest.mark.conformance
@needs_vllm
def test_a_v1_scheduler_schedules_a_request_of_a_case(cache):
    from repro.upstream.config import scheduler, vllm_config
    up = upstream.load()
    cfg = vllm_config(up, Case(spec_tokens=2, block_size=4, cache=cache))
    sched, hasher = scheduler(up, cfg, num_blocks=64)
    sp = up.sampling_params.SamplingParams(max_tokens=4, temperature=0.0)
    sched.add_request(up.request.Request(request_id="0", prompt_token_ids=list(range(1, 12)), sampling_params=sp,
                                         pooling_params=None, block_hasher=hasher))
    out = sched.schedule()
    # align mode: the prompt's first chunk ends on a block boundary (8 of 11 tokens); the state group's
    # row holds the null block before the running column and K speculative columns after it
    assert out.num_scheduled_tokens == {"0": 8}
    assert out.scheduled_new_reqs[0].block_ids[1][0] == 0 and len(out.scheduled_new_reqs[0].block_ids[1]) == 4
