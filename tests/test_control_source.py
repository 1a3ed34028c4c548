"""Where the control decisions come from (`--control`, `--patch`), without vLLM: the patch files'
contract, the refusals of what a vLLM source cannot honour, and the plan under it. The decisions
themselves under vLLM are `test_vllm_control.py`'s (conformance)."""
import subprocess
import sys
import types
from pathlib import Path

import pytest

from repro.errors import BadInput
from repro.job.cases import plan
from repro.knobs import hazards as hz
from repro.knobs.control import Control, check, decided_by_vllm
from repro.upstream import load as upstream
from repro.upstream.patches import applied, read, shipped
from repro.upstream import paths
from repro.upstream.paths import ready

ROOT = Path(__file__).resolve().parents[1]


def _patch(tmp_path, text: str, name: str = "p.py") -> str:
    f = tmp_path / name
    f.write_text(text)
    return str(f)


def test_the_shipped_patches_keep_the_contract_and_name_their_pull_requests():
    titles = {Path(p).stem: read(p).title for p in shipped()}
    assert set(titles) == {"vllm_pr47123", "vllm_pr53059", "vllm_pr55123"}
    for name, title in titles.items():
        assert title.startswith(f"vLLM PR #{name.removeprefix('vllm_pr')}"), title


@pytest.mark.parametrize("text, why", [
    ("def apply(vllm):\n    pass\n", "no docstring"),
    ('"""x"""\nimport vllm.config\ndef apply(vllm):\n    pass\n', "imports vllm.config"),
    ('"""x"""\nfrom vllm.v1 import worker\ndef apply(vllm):\n    pass\n', "imports vllm.v1"),
    ('"""x"""\ndef apply(vllm, other):\n    pass\n', "no function `apply(vllm)` of one parameter"),
    ('"""x"""\napply = 3\n', "no function `apply(vllm)`"),
    ('"""x"""\ndef apply(vllm:\n', "cannot be read as Python (SyntaxError"),
    ('"""x"""\nraise RuntimeError("boom")\n', "running it raised RuntimeError: boom"),
])
def test_a_patch_file_that_breaks_the_contract_is_refused_in_one_line(tmp_path, text, why):
    with pytest.raises(BadInput, match=None) as e:
        read(_patch(tmp_path, text))
    assert why in str(e.value) and "\n" not in str(e.value) and "--patch" in str(e.value)


def test_a_patch_that_is_not_a_python_file_is_refused(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        read(str(tmp_path / "missing.py"))
    (tmp_path / "p.txt").write_text('"""x"""\n')
    with pytest.raises(BadInput, match="not a Python file"):
        read(str(tmp_path / "p.txt"))


class Runner:
    """A stand-in for a vLLM class: the contract's mechanics need no vLLM."""

    @staticmethod
    def decide(x):
        return "shape"


def _up():
    return types.SimpleNamespace(version="0.33.0", gpu_model_runner=types.SimpleNamespace(GPUModelRunner=Runner))


def test_a_patch_changes_only_for_as_long_as_it_is_applied(tmp_path):
    p = _patch(tmp_path, '"""Fork change: decide by phase."""\n'
                         "def apply(vllm):\n"
                         "    old = vllm.replace(vllm.gpu_model_runner.GPUModelRunner, 'decide', lambda self, x: 'phase')\n"
                         "    assert isinstance(old, staticmethod)\n")
    with applied(_up(), [p]):
        assert Runner().decide(1) == "phase"
    assert Runner().decide(1) == "shape" and isinstance(Runner.__dict__["decide"], staticmethod)


@pytest.mark.parametrize("body, why", [
    ("    vllm.replace(vllm.gpu_model_runner.GPUModelRunner, 'gone', 1)\n", "has no attribute 'gone' in vLLM 0.33.0"),
    ("    pass\n", "apply replaced nothing"),
])
def test_a_patch_that_does_not_fit_this_vllm_is_refused_and_vllm_restored(tmp_path, body, why):
    first = _patch(tmp_path, '"""a"""\ndef apply(vllm):\n'
                             "    vllm.replace(vllm.gpu_model_runner.GPUModelRunner, 'decide', lambda self, x: 'a')\n",
                   "first.py")
    with pytest.raises(BadInput, match=why):
        with applied(_up(), [first, _patch(tmp_path, '"""b"""\ndef apply(vllm):\n' + body)]):
            pass
    assert Runner.decide(1) == "shape"


def test_a_patch_needs_a_vllm_source_and_a_source_must_be_known():
    with pytest.raises(BadInput, match="--patch changes the installed vLLM: it needs --control vllm"):
        Control("mirror", ("patches/vllm_pr53059.py",))
    with pytest.raises(BadInput, match="unknown --control 'vllm-v3'"):
        Control("vllm-v3")
    assert Control("vllm", ("patches/vllm_pr53059.py",)).label() == "vllm+vllm_pr53059"


def test_under_vllm_the_mirror_knobs_it_decides_are_refused():
    v = Control("vllm")
    with pytest.raises(BadInput, match="--stack vllm-0.26: --control vllm runs the installed vLLM's own rules"):
        check(v, stack="vllm-0.26")
    with pytest.raises(BadInput, match="--hazard shape-only-uniform-decode: under --control vllm"):
        check(v, hazards=("shape-only-uniform-decode",))
    with pytest.raises(BadInput, match="--repair sanitize-pad"):
        check(v, repairs=("sanitize-pad",))
    with pytest.raises(BadInput, match="--sentinel -1"):
        check(v, sentinel=-1)
    check(v, hazards=("shared-pool-weakref",))  # a graph-runner hazard runs on vLLM's decisions too
    check(Control(), stack="vllm-0.26", hazards=("shape-only-uniform-decode",), sentinel=-1)


def test_the_default_plan_under_vllm_leaves_out_what_vllm_decides():
    mirror = plan("all", None, (), (), False, spec_tokens=None)
    vllm = plan("all", None, (), (), False, spec_tokens=None, control=Control("vllm"))
    dropped = {h for c in mirror for h in c.hazards} - {h for c in vllm for h in c.hazards}
    assert dropped and all(decided_by_vllm(hz.HAZARDS[h].sets) for h in dropped)
    assert "shape-only-uniform-decode" in dropped and "shared-pool-weakref" not in dropped
    assert all(c.control == Control("vllm") for c in vllm)
    assert [c for c in vllm if not c.hazards and c.spec_tokens == 2]  # the K=2 baseline rows stay


def test_without_vllm_a_vllm_source_is_refused_naming_the_tox_environment(monkeypatch):
    monkeypatch.setattr(upstream, "installed", lambda: None)
    with pytest.raises(upstream.UpstreamMissing, match=r"--control vllm: vLLM is not installed .*`tox -e vllm033`"):
        ready(Control("vllm"))
    ready(Control())  # the mirror needs nothing


def test_another_release_than_the_driven_one_is_refused_naming_it(monkeypatch):
    """The runners' decisions are rebuilt around 0.33.0's model runners: with 0.26.0 installed (its seam
    serves `repro conform`), `--control vllm` is refused in one line naming the release it drives."""
    for where in (upstream, paths):
        monkeypatch.setattr(where, "installed", lambda: "0.26.0")
    with pytest.raises(upstream.UpstreamMissing, match=r"--control vllm: vLLM 0.26.0 is installed; .* vLLM 0.33.0's"):
        ready(Control("vllm"))


@pytest.mark.skipif(upstream.installed() is not None, reason="vLLM is installed here: this checks the command without it")
@pytest.mark.parametrize("argv", [["run", "--control", "vllm", "--steps", "1"],
                                  ["hunt", "--control", "vllm-v2", "--max-examples", "1"],
                                  ["run", "--patch", "patches/vllm_pr53059.py", "--steps", "1"]])
def test_the_command_line_refuses_in_one_line_with_exit_2(argv):
    out = subprocess.run([sys.executable, "-m", "repro", *argv], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and out.stdout == "" and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "tox -e vllm033" in out.stderr or "--patch changes the installed vLLM" in out.stderr
