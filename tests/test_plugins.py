"""Users bring their own kernels (the registry side): `registry.load_plugins` imports
modules that register providers, before selection; a bad module is one clear error."""
import textwrap

import pytest
import torch

from kernels import registry
from kernels.errors import KernelSelectionError
from kernels.norms.reference import rms_norm_reference

PLUGIN = """
    import torch

    from kernels import registry

    calls = []


    def rms_norm_mine(x, w, eps):
        calls.append(tuple(x.shape))
        xf = x.float()
        return (xf * torch.rsqrt((xf * xf).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).to(x.dtype)


    registry.register("rms_norm", "myprov", rms_norm_mine, group="norms", batch_invariant=False)
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """tmp_path first on sys.path; providers and modules the test adds are removed afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    before = {op: set(registry.providers(op)) for op in registry.ops()}
    registry.reset()
    yield tmp_path
    registry.reset()
    for op, names in before.items():
        for name in set(registry._providers[op]) - names:
            del registry._providers[op][name]
    import sys
    for mod in [m for m in sys.modules if m.startswith("repro_test_plugin")]:
        del sys.modules[mod]


def _write(d, name, text):
    (d / f"{name}.py").write_text(textwrap.dedent(text))


def test_a_plugin_provider_is_selected_and_runs(plugin_dir):
    _write(plugin_dir, "repro_test_plugin_norm", PLUGIN)
    with pytest.raises(KernelSelectionError, match="myprov"):
        registry.configure("rms_norm=myprov")  # not there before the plugin is loaded
    assert registry.load_plugins("repro_test_plugin_norm") == ["repro_test_plugin_norm"]
    registry.configure("rms_norm=myprov")
    assert registry.selected("rms_norm") == "myprov"
    assert registry.batch_invariant("rms_norm") is False
    import repro_test_plugin_norm as plugin
    x = torch.randn(3, 64).to(torch.bfloat16)
    w = (torch.randn(64) * 0.1).to(torch.bfloat16)
    out = torch.ops.repro.rms_norm(x, w, 1e-6)
    assert plugin.calls == [(3, 64)]   # the op ran through the plugin's function
    torch.testing.assert_close(out, rms_norm_reference(x, w, 1e-6), rtol=2 ** -7, atol=1e-6)


def test_plugins_load_in_order_from_a_comma_list(plugin_dir):
    import sys
    _write(plugin_dir, "repro_test_plugin_a", "LOADED = True\n")
    _write(plugin_dir, "repro_test_plugin_b", "LOADED = True\n")
    assert registry.load_plugins(" repro_test_plugin_b, ,repro_test_plugin_a ") == \
        ["repro_test_plugin_b", "repro_test_plugin_a"]
    assert sys.modules["repro_test_plugin_a"].LOADED and sys.modules["repro_test_plugin_b"].LOADED


@pytest.mark.parametrize("name, body, expected", [
    ("repro_test_plugin_missing", None, "kernel plugin 'repro_test_plugin_missing': no module named"),
    ("repro_test_plugin_raises", "raise RuntimeError('boom\\nsecond line')\n",
     "kernel plugin 'repro_test_plugin_raises' failed to import: RuntimeError: boom second line"),
    ("repro_test_plugin_dep", "import repro_no_such_dependency_xyz\n",
     "kernel plugin 'repro_test_plugin_dep' failed to import: ModuleNotFoundError: No module named "
     "'repro_no_such_dependency_xyz'"),
    ("repro_test_plugin_twice",
     "from kernels import registry\nregistry.register('rms_norm', 'reference', lambda x, w, eps: x)\n",
     "kernel plugin 'repro_test_plugin_twice' failed to import: ValueError: provider 'reference' registered twice"),
])
def test_a_bad_plugin_is_one_line_naming_module_and_cause(plugin_dir, name, body, expected):
    if body is not None:
        _write(plugin_dir, name, body)
    with pytest.raises(KernelSelectionError) as e:
        registry.load_plugins([name])
    assert str(e.value).startswith(expected)
    assert "\n" not in str(e.value)
    assert registry.selected("rms_norm") == "reference"  # nothing selected by a failed load


def test_env_plugins_load_before_env_selection(plugin_dir):
    """REPRO_PLUGINS is imported when `kernels` is, before REPRO_KERNELS applies: the plugin (which
    imports `kernels` itself) registers first, so the environment can select its provider."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    _write(plugin_dir, "repro_test_plugin_env", PLUGIN)
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin_dir), str(root)]),
               REPRO_PLUGINS="repro_test_plugin_env", REPRO_KERNELS="rms_norm=myprov")
    code = "import kernels; print(kernels.registry.selected('rms_norm'))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=plugin_dir,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "myprov"
    env["REPRO_PLUGINS"] = ""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=plugin_dir,
                       timeout=300)
    assert r.returncode != 0 and "myprov" in r.stderr.strip().splitlines()[-1]
