"""Write docs/real-bugs.md from the hazard table, the stack profiles and `repro bench --hunt-rates`
results: `python tools/real_bugs.py RATES.json [MORE.json ...] > docs/real-bugs.md` (no argument: the
table alone; each further result, the same bench under other kernels, adds a column).
The `repro` beside this script is the one read, not an installed copy."""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    from repro.report.real_bugs import render
    sys.stdout.write(render(sys.argv[1] if len(sys.argv) > 1 else None, *sys.argv[2:]))
