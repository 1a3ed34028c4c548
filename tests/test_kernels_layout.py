"""`kernels` stands on its own: providers in their op's folder, no import of
`repro`, its own errors, and a loud failure when another package named `kernels` shadows it."""
import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import kernels
from kernels import registry

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, *path_first: Path, cwd: Path) -> subprocess.CompletedProcess:
    """`python -c code` in `cwd` (outside the repository: `-c` puts the working directory first on
    sys.path) with `path_first` before the repository on PYTHONPATH."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, path_first), str(ROOT)]))
    env.pop("REPRO_KERNELS", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=300)


def test_no_module_under_kernels_imports_repro():
    offenders = []
    for path in (ROOT / "kernels").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "repro"]
    assert offenders == []


def test_kernels_imports_and_fails_without_repro(tmp_path):
    r = _run("import sys; sys.modules['repro'] = None\n"
             "import kernels\n"
             "from kernels.errors import KernelSelectionError\n"
             "try:\n    kernels.registry.configure('moe=nope')\n"
             "except KernelSelectionError as e:\n    print('raised', isinstance(e, ValueError))\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'repro' and sys.modules[m] is not None))",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["raised True", "[]"]


def test_every_provider_is_declared_in_its_ops_folder():
    """Each folder's table names functions of modules in that folder (a `triton` one in its
    `triton.py`), found without importing them; a provider declared without one is absent. (A
    provider registered as a function, a plugin's or another test's, has no module to check.)"""
    folders = {"w8a8": "w8a8_linear"}  # group -> folder, where the names differ
    seen = set()
    for group, ops in registry.groups().items():
        for op in ops:
            for provider in registry.providers(op):
                where = registry.where(op, provider)
                if where is None:
                    continue
                module, name = where
                parts = module.split(".")
                assert parts[:2] == ["kernels", folders.get(group, group)] and len(parts) == 3, (op, provider, module)
                assert provider != "triton" or parts[2] == "triton", (op, module)
                assert importlib.util.find_spec(module) is not None, module
                assert f"\ndef {name}(" in (ROOT / "kernels" / parts[1] / f"{parts[2]}.py").read_text(), (op, name)
                seen.add((op, provider))
    assert {("moe", "vllm_xpu"), ("rms_norm", "vllm_xpu"), ("gated_delta_rule_decode", "fla"),
            ("w8a8_linear", "triton"), ("causal_conv1d_fn", "reference")} <= seen
    assert registry.where("gated_delta_rule_spec", "fla") is None
    assert not registry.providers("gated_delta_rule_spec")["fla"][0]
    assert importlib.util.find_spec("kernels.w8a8_linear.sweep") is not None


def test_a_provider_module_is_imported_on_first_use_only(tmp_path):
    """`import kernels` and listing every provider import no provider's module and no optional
    package (Triton, FLA, vllm-xpu-kernels); the first call of an op imports its provider's."""
    r = _run("import sys, torch, kernels\n"
             "kernels.registry.describe()\n"
             "wheres = {kernels.registry.where(op, p) for op in kernels.registry.ops() "
             "for p in kernels.registry.providers(op)} - {None}\n"
             "def loaded():\n"
             "    return sorted({m for m, _ in wheres if m in sys.modules} | {m for m in sys.modules "
             "if m.split('.')[0] in ('triton', 'fla', 'vllm_xpu_kernels')})\n"
             "print(loaded())\n"
             "kernels.ops.rms_norm(torch.ones(2, 8), torch.zeros(8), 1e-6)\n"
             "print(loaded())", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    # the FLA provider's module holds its own availability check, and imports no fla to run it
    assert r.stdout.split("\n")[:2] == ["['kernels.gdn.fla']", "['kernels.gdn.fla', 'kernels.norms.reference']"]


def test_check_identity_names_this_folder():
    assert kernels.PROJECT == "repro-graph-replay"
    assert Path(kernels.check_identity()) == ROOT / "kernels"


def test_a_shadowing_kernels_package_fails_loudly_naming_both(tmp_path):
    fake = tmp_path / "site" / "kernels"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('"""Stand-in for Hugging Face\'s `kernels` package."""\n__version__ = "0.4.4"\n')
    r = _run("from repro.env import project_kernels; project_kernels()", tmp_path / "site", cwd=tmp_path)
    assert r.returncode != 0
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("repro.env.KernelsShadowed: ")
    assert str(fake) in last and str(ROOT / "kernels") in last
    ok = _run("from repro.env import project_kernels; print(project_kernels().check_identity())", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip() == str(ROOT / "kernels")
