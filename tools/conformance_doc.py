"""Write docs/conformance.md from `repro conform --json` results (one per stack profile and vLLM
release run, negative controls included): `python tools/conformance_doc.py R1.json R2.json ... >
docs/conformance.md`. The `repro` beside this script is the one read, not an installed copy; it needs
no vLLM (the results hold what was measured)."""
import json
import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
    from repro.conform.table import markdown
    sys.stdout.write(markdown([json.load(open(p)) for p in sys.argv[1:]]))
