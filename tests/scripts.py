"""The generated standalone script as the tests drive it: written from a `repro run` result, loaded
as a module (to count what its runner reaches) or run the way a maintainer would (its own folder,
no PYTHONPATH, nothing of this suite)."""
import importlib.util
import json
import linecache
import os
import subprocess
import sys
import types

from repro.cli.app import main
from repro.report import SCRIPT, load_result, write_report
from repro.report.standalone.generate import template


def module(path, name):
    """The file at `path` imported as module `name` (a written script)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def template_module(name):
    """The script's template (its parts joined, nothing filled in) as module `name`."""
    text, where = template(), f"<standalone template {name}>"
    linecache.cache[where] = (len(text), None, text.splitlines(True), where)  # tracebacks show its lines
    mod = types.ModuleType(name)
    exec(compile(text, where, "exec"), mod.__dict__)
    return mod


def report(tmp_path, argv):
    """`repro run --device cpu ARGV`, then its report (the first result, not verified): (result, folder)."""
    res = tmp_path / "r.json"
    main(["run", "--device", "cpu", "--json", str(res)] + argv)
    doc = load_result(res)
    return doc, write_report(doc, tmp_path / "rep", index=0, verify=False)


def run_script(folder, *extra):
    """Run the written script on the CPU: (the process, its RESULT line as a dict or None)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", *extra], cwd=folder, env=env, capture_output=True,
                       text=True, timeout=300)
    got = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    return p, json.loads(got[-1][len("RESULT "):]) if got else None
