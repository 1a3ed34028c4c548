"""The standalone reproducers of the public record (`repro/report/standalone/vllm_*.py`): torch only,
exit 1 where the bug reproduces and 0 with `--repair`, on the suite's device."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "repro" / "report" / "standalone"
SCRIPTS = ("vllm_53051.py", "vllm_51565.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_script_imports_only_torch_and_the_standard_library(script):
    src = (HERE / script).read_text()
    roots = {m.split(".")[0] for m in re.findall(r"^\s*(?:import|from)\s+([\w.]+)", src, re.M)}
    assert roots <= {"argparse", "sys", "torch"}, roots


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_bug_reproduces_and_the_repair_clears_it(script, device):
    dev = "cuda" if device.startswith("cuda") else "cpu"
    bad = subprocess.run([sys.executable, str(HERE / script), "--device", dev], capture_output=True, text=True,
                         timeout=300)
    good = subprocess.run([sys.executable, str(HERE / script), "--device", dev, "--repair"], capture_output=True,
                          text=True, timeout=300)
    assert bad.returncode == 1 and "REPRODUCED" in bad.stdout, bad.stdout + bad.stderr
    assert good.returncode == 0 and "not reproduced" in good.stdout, good.stdout + good.stderr


def test_a_bad_argument_is_one_line_and_exit_2():
    r = subprocess.run([sys.executable, str(HERE / SCRIPTS[0]), "--device", "tpu"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == ""
