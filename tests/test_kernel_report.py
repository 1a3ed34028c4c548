"""A kernel finding becomes a report with its own script.

The lab's kernels arrive as a package of their own plus a plugin that registers them. Here the
package is `repro_test_kmath` (torch only) and the plugin `repro_test_kplug` registers two of its
functions for `rms_norm`: one that varies from call to call on identical inputs, one that rounds by
row count. `repro run --report` on each must name the function, and write `repro_kernel.py` and
`kernel_inputs.pt`: run with neither `repro` nor `kernels` importable, the script shows the effect
(exit 1). A kernel that corrupts gets no kernel script (it is not a kernel finding)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap

import pytest

KMATH = '''
    import torch

    _calls = [0]


    def _norm(x, w, eps):
        """Gemma-style RMS norm (the suite's reference computes the same, up to summation order)."""
        v = x.float()
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())


    def wobble(x, w, eps):
        """Nondeterministic: the scale moves with a call counter, a fraction of a bf16 ulp."""
        _calls[0] += 1
        return (_norm(x, w, eps) * (1 + ((_calls[0] % 3) - 1) * 2.0 ** -9)).to(x.dtype)


    def by_rows(x, w, eps):
        """Batch-variant: the scale depends on the row count."""
        return (_norm(x, w, eps) * (1 + x.shape[0] * 2.0 ** -11)).to(x.dtype)
'''

KPLUG = '''
    from kernels import registry
    import repro_test_kmath as k

    registry.register("rms_norm", "kwobble", k.wobble, batch_invariant=False)
    registry.register("rms_norm", "kbyrows", k.by_rows, batch_invariant=False)
'''

# The script runs with the suite's packages made unimportable: only torch and the kernel's package.
ISOLATED = ("import runpy, sys\n"
            "for m in ('repro', 'kernels'):\n"
            "    sys.modules[m] = None\n"
            "sys.argv = ['repro_kernel.py']\n"
            "runpy.run_path('repro_kernel.py', run_name='__main__')\n")


@pytest.fixture(scope="module")
def pkg(tmp_path_factory):
    d = tmp_path_factory.mktemp("kpkg")
    (d / "repro_test_kmath.py").write_text(textwrap.dedent(KMATH))
    (d / "repro_test_kplug.py").write_text(textwrap.dedent(KPLUG))
    return d


def _env(pkg, kernel):
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([str(pkg), root])
    env.update(REPRO_PLUGINS="repro_test_kplug", REPRO_KERNELS=f"rms_norm={kernel}")
    return env


def _run_with_report(pkg, tmp_path, kernel, tiny_path):
    out = tmp_path / "report"
    r = subprocess.run([sys.executable, "-m", "repro", "run", "--model", str(tiny_path), "--island", "submod1",
                        "--steps", "12", "--json", str(tmp_path / "r.json"), "--report", str(out)],
                       capture_output=True, text=True, env=_env(pkg, kernel), cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return out, json.loads((tmp_path / "r.json").read_text())


@pytest.mark.parametrize("kernel, kind, function", [("kwobble", "nondeterminism", "repro_test_kmath.wobble"),
                                                    ("kbyrows", "batch variance", "repro_test_kmath.by_rows")])
def test_a_kernel_finding_gets_a_script_of_torch_and_the_kernel_package(pkg, tmp_path, tiny_path, kernel, kind,
                                                                          function):
    out, doc = _run_with_report(pkg, tmp_path, kernel, tiny_path)
    assert doc["plugins"] == ["repro_test_kplug"] and doc["kernels"]["rms_norm"] == kernel
    first = doc["results"][0]["kernel_findings"][kind]["first"]
    assert first["kernel"]["function"] == function and first["kernel"]["max_abs"] > 0
    report = (out / "REPORT.md").read_text()
    assert "## Kernel finding" in report and f"`{function}`" in report
    script = (out / "repro_kernel.py").read_text()
    imported = {a.name.split(".")[0] for n in ast.walk(ast.parse(script)) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(ast.parse(script)) if isinstance(n, ast.ImportFrom)}
    assert imported == {"importlib", "sys", "torch"}  # the kernel's package is imported by name, at run time
    env = {k: v for k, v in os.environ.items() if k not in ("REPRO_PLUGINS", "REPRO_KERNELS")}
    env["PYTHONPATH"] = str(pkg)  # the kernel's package only
    r = subprocess.run([sys.executable, "-c", ISOLATED], capture_output=True, text=True, env=env, cwd=out,
                       timeout=120)
    assert r.returncode == 1, (r.stdout, r.stderr[-2000:])
    assert r.stdout.startswith(f"{function}: {kind}: ") and "max |d| = 0\n" not in r.stdout


def test_a_corrupting_kernel_gets_no_kernel_script(pkg, tmp_path, tiny_path):
    (pkg / "repro_test_kbad.py").write_text(textwrap.dedent('''
        from kernels import registry
        import repro_test_kmath as k

        def bad(x, w, eps):
            out = k.by_rows(x, w, eps)
            return out * 3 if x.shape[0] % 2 == 0 else out

        registry.register("rms_norm", "kbad", bad, batch_invariant=False)
    '''))
    out = tmp_path / "report"
    env = _env(pkg, "kbad")
    env["REPRO_PLUGINS"] = "repro_test_kbad"
    r = subprocess.run([sys.executable, "-m", "repro", "run", "--model", str(tiny_path), "--island", "submod1",
                        "--steps", "12", "--report", str(out)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 1, r.stderr[-2000:]  # corruption fails the run
    assert not (out / "repro_kernel.py").exists() and "## Kernel finding" not in (out / "REPORT.md").read_text()
