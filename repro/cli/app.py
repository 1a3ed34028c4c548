"""`repro` command line. Exit codes: 0 clean, 1 divergence found (or a planted hazard missed),
2 bad input (one line on stderr, never a traceback).

This is the edge: arguments are parsed (`parser.py`), checked and turned into a typed config
per command (the argparse Namespace goes no further than `repro/cli/`), environment variables
are read here (`environ.py`), and each command makes one library call with its config. The
library modules are imported inside the functions that need them, so `repro --help` stays fast."""
from __future__ import annotations

import os
import sys

from ..errors import BadInput
from . import environ
from .parser import parser

# What `repro --help` says before the commands, each of which says what it is for.
HELP = """Find where device-graph replay of Qwen3.6-35B-A3B's layers (W8A8 INT8) departs from eager
execution, shrink it to a minimal request sequence, and write it up for upstream maintainers.

The usual path: `repro env` (what this machine has), `repro run` (every island and hazard, on the
embedded tiny checkpoint or --model DIR), `repro hunt` (search for a sequence that diverges; with
--stack NAME, blind, under a vLLM release's own control rules), then `repro report RESULT.json
-o DIR` (REPORT.md and a script that needs only torch, to attach to an upstream issue).
Every command's options: repro COMMAND --help.

exit codes: 0 clean (nothing found), 1 a divergence, finding or MISSED hazard, 2 bad input (one
line on stderr); 130 interrupted."""

# command -> (module of this package, function): imported only when the command runs
COMMANDS = {"env": ("env", "env"), "make-tiny": ("model", "make_tiny"), "inspect": ("model", "inspect"),
            "run": ("run", "run"), "hunt": ("run", "hunt"), "report": ("report", "report"),
            "bench": ("bench", "bench"), "conform": ("conform", "conform")}


def _kernels(plugins) -> None:
    """Import this project's `kernels` (refusing another package of that name in one line; a bad
    $REPRO_KERNELS or $REPRO_PLUGINS is refused there), then the --plugin modules, one at a time
    so that one calling sys.exit while it is imported is named (a plugin only registers providers;
    its exit would otherwise end repro with its code and no word)."""
    from ..env import project_kernels
    try:
        kernels = project_kernels()
    except SystemExit as e:
        raise BadInput(f"$REPRO_PLUGINS={environ.plugins()!r}: a module called sys.exit({e.code}) while being "
                       "imported") from None
    for name in plugins:
        try:
            kernels.registry.load_plugins([name])
        except SystemExit as e:
            raise BadInput(f"--plugin {name}: called sys.exit({e.code}) while being imported") from None


def _bad_kernels(e: Exception) -> bool:
    """Bad input about kernels: a selection or plugin `kernels` refused (its own error class: it
    imports nothing of repro's), or another package shadowing this project's `kernels`."""
    if type(e).__module__ == "kernels.errors":
        return True
    from ..env import KernelsShadowed
    return isinstance(e, KernelsShadowed)


def _call(a) -> int:
    import importlib
    module, name = COMMANDS[a.cmd]
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)(a)


def main(argv=None) -> int:
    try:
        a = parser(HELP).parse_args(argv)
    except SystemExit as e:  # usage errors (one line, see parser.Parser) and --help: a return code in-process
        return e.code if isinstance(e.code, int) else 2
    a.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if a.cmd in ("run", "hunt", "bench"):
            _kernels(a.plugin)
        return _call(a)
    except BadInput as e:
        print(f"repro: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, ImportError) as e:
        if not _bad_kernels(e):
            raise
        print(f"repro: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("repro: error: out of memory (try a smaller preset, fewer steps, or another --device)", file=sys.stderr)
        return 2
    except RuntimeError as e:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
            print(f"repro: error: out of memory on the device ({str(e).splitlines()[0][:160]})", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:  # SIGINT: say so, and nothing else (a search's partial state means nothing)
        print("repro: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # a print that did not go through `io.emit`: the reader left, and so do we
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # what a shell shows for a process ended by SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
