"""Write docs/real-bugs.md from the hazard table, the stack profiles and a `repro bench --hunt-rates`
result: `python tools/real_bugs.py RATES.json > docs/real-bugs.md` (no argument: the table alone).
The `repro` beside this script is the one read, not an installed copy."""
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    from repro.report.real_bugs import render
    sys.stdout.write(render(sys.argv[1] if len(sys.argv) > 1 else None))
