"""Write docs/real-bugs.md from the hazard table, the stack profiles and a `repro bench --hunt-rates`
result: `python tools/real_bugs.py RATES.json > docs/real-bugs.md` (no argument: the table alone)."""
import sys

from repro.report.real_bugs import render

if __name__ == "__main__":
    sys.stdout.write(render(sys.argv[1] if len(sys.argv) > 1 else None))
