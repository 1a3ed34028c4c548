"""The command line is the edge: argparse and the environment stay in `repro/cli/`, every command
hands the library one frozen config, and `repro --help` imports no library module it does not
need."""
import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLI = ROOT / "repro" / "cli"
# Files outside the CLI that touch os.environ, and why that is not reading configuration:
NOT_CONFIG = {
    "repro/report/script.py": "copies the environment for the standalone script's child process",
    "repro/comm/rank.py": "sets GLOO_SOCKET_IFNAME for its own process group (a write)",
    "repro/check/outflags.py": "REPRO_OUTFLAGS, read where the device check is built",
}


def _library_files():
    return [p for p in (ROOT / "repro").rglob("*.py") if CLI not in p.parents]


def test_no_library_module_reads_the_environment():
    readers = []
    for p in _library_files():
        rel = str(p.relative_to(ROOT))
        for node in ast.walk(ast.parse(p.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else None
            if name in ("environ", "getenv") and rel not in NOT_CONFIG:
                readers.append(f"{rel}:{node.lineno}")
    assert not readers, readers


def test_argparse_stays_in_the_cli():
    users = [str(p.relative_to(ROOT)) for p in _library_files()
             if "argparse" in p.read_text() and "standalone" not in p.parts]  # the generated script has its own
    assert not users, users


def test_every_command_calls_one_library_function_with_a_frozen_config():
    from repro.commands.bench import BenchConfig
    from repro.commands.env import EnvConfig
    from repro.commands.hunt import HuntConfig
    from repro.commands.model import InspectConfig, MakeTinyConfig
    from repro.commands.report import ReportConfig
    from repro.commands.run import RunConfig
    for cls in (BenchConfig, EnvConfig, RunConfig, InspectConfig, MakeTinyConfig, ReportConfig, HuntConfig):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls


def test_cli_modules_are_small_and_import_the_library_inside_functions():
    for p in CLI.glob("*.py"):
        text = p.read_text()
        assert len(text.splitlines()) < 400, p
        for n in ast.parse(text).body:  # module level: the standard library, siblings and `errors` only
            if isinstance(n, ast.ImportFrom) and n.level == 2:
                assert n.module == "errors", (p.name, n.module)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and not getattr(n, "level", 0):
                names = [n.module] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names]
                assert all(x.split(".")[0] in sys.stdlib_module_names for x in names), (p.name, names)


def test_help_does_not_import_torch_heavy_library_modules():
    code = ("import sys; from repro.cli.app import main\n"
            "try: main(['--help'])\nexcept SystemExit: pass\n"
            "heavy = ('repro.commands', 'repro.job', 'repro.search.hunt', 'repro.report', 'repro.bench.output')\n"
            "print('loaded:' + ','.join(m for m in heavy "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "loaded:", out.stdout
