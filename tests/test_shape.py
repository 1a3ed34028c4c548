"""A step's shape has one home (`repro/control/shape.py`): 1+K is computed there and nowhere else,
and the runners, their control paths and the copies are built from one `StepShape`."""
import ast
import dataclasses
from pathlib import Path

import pytest

from repro.control.shape import StepShape, decode_len
from repro.scheduler.sequence import Request, Sequence

ROOT = Path(__file__).resolve().parent.parent
HOME = ROOT / "repro" / "control" / "shape.py"
# the scripts an upstream reviewer runs with torch (and vLLM) alone import nothing from the suite, so
# they state 1+K in their own words (their tests hold them equal to the suite: test_standalone*.py)
STANDALONE = ROOT / "repro" / "report" / "standalone"
K_NAMES = {"k", "K", "spec_tokens", "spec", "num_spec_tokens", "num_speculative_tokens"}


def _name(node) -> str | None:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None


def _one(node) -> bool:
    return isinstance(node, ast.Constant) and node.value == 1 and not isinstance(node.value, bool)


def one_plus_k(tree) -> list[int]:
    """Lines adding 1 to a draft-token count: `1 + k`, `k + 1`, `x + 1 + k`, `x + k + 1`."""
    found = []
    for n in ast.walk(tree):
        if not (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add)):
            continue
        pairs = [(n.left, n.right), (n.right, n.left)]
        if isinstance(n.left, ast.BinOp) and isinstance(n.left.op, ast.Add):
            pairs += [(n.left.right, n.right), (n.right, n.left.right)]
        if any(_one(a) and _name(b) in K_NAMES for a, b in pairs):
            found.append(n.lineno)
    return found


def test_the_rule_sees_each_spelling():
    src = "a = 1 + k\nb = spec_tokens + 1\nc = x + 1 + self.k\nd = y + k + 1\ne = 2 + k\nf = 1 + n\ng = decode_len(k)\n"
    assert one_plus_k(ast.parse(src)) == [1, 2, 3, 4]


def test_only_the_shape_computes_one_plus_k():
    found = sorted(f"{p.relative_to(ROOT)}:{line}" for p in (ROOT / "repro").rglob("*.py")
                   if p != HOME and STANDALONE not in p.parents for line in one_plus_k(ast.parse(p.read_text())))
    assert not found, found
    assert one_plus_k(ast.parse(HOME.read_text()))  # and the home does


def test_a_shape_is_frozen_and_built_from_its_sequence():
    seq = Sequence([Request(0, 5, 3)], num_slots=4, max_tokens=24, spec_tokens=2, block_size=8, data_parallel=True)
    shape = StepShape.of(seq, sizes=[1, 2, 4], slots=6)
    assert shape == StepShape(2, 4, 24, (1, 2, 4), 8, True, 6)
    assert shape.decode_len == decode_len(2) == 3
    assert StepShape.of(seq, max_tokens=40).max_tokens == 40 and StepShape.of(seq).slots == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.spec_tokens = 3
