"""Assemble the standalone script: the suite's own reference kernels, copied in by source, plus
the hand-written driver, kept in parts in `gdn_chain/` and joined here into the one file written.

Why: the script used to carry a second, hand-kept copy of the kernel math, which had already
drifted (plain `.mean` where the suite sums in a fixed order, a token-by-token prefill where the
suite solves chunks). Now the math is whatever `kernels/*/reference.py` says at generation time:
each root function below and every kernels-level function or constant it reads (found by walking
its bytecode and its default arguments) is copied with `inspect.getsource`, dependencies first.
The script still imports nothing from the project: a helper that is not plain torch code (a
module other than torch, a class, a registry) stops the generation with `GenerationError`
instead of producing a script that cannot run on its own.
"""
from __future__ import annotations

import ast
import dis
import inspect
import json
import textwrap
import types
from pathlib import Path

# The driver's parts, in the order the script carries them. They are pieces of one script, not
# modules: each reads names the others define (and the kernels pasted in at the math marker), so
# none imports on its own. Hence the `.py.in` suffix: the package's module walk (tests/test_imports.py)
# and an import by name pass them by; ruff lints them as Python (pyproject.toml).
PARTS = ("head", "math", "weights", "islands", "control", "builder", "graphs", "lockstep")
PARTS_DIR = Path(__file__).with_name("gdn_chain")
SPEC_MARKER = "SPEC_JSON = None  # @SPEC@ (filled in by `repro report`)"
MATH_MARKER = "# @MATH@ (the suite's reference kernels, copied in by `repro report`)"

# What the driver calls, under these names (module, function).
ROOTS = (
    ("kernels.norms.reference", "rms_norm_reference"),
    ("kernels.norms.reference", "add_rms_norm_reference"),
    ("kernels.norms.reference", "rms_norm_gated_reference"),
    ("kernels.w8a8_linear.reference", "w8a8_linear_reference"),
    ("kernels.conv1d.reference", "causal_conv1d_update_reference"),
    ("kernels.conv1d.reference", "causal_conv1d_fn_reference"),
    ("kernels.conv1d.reference", "causal_conv1d_update_spec_reference"),
    ("kernels.gdn.reference", "gdn_gating_reference"),
    ("kernels.gdn.reference", "gated_delta_rule_decode_reference"),
    ("kernels.gdn.reference", "gated_delta_rule_prefill_reference"),
    ("kernels.gdn.reference", "gated_delta_rule_spec_reference"),
    ("kernels.moe.reference", "moe_reference"),
)
# Names the script's header provides (its own imports).
PROVIDED = {"torch": "torch", "F": "torch.nn.functional", "math": "math"}


class GenerationError(RuntimeError):
    """A reference kernel reads something the standalone script cannot carry."""


def _loaded_names(code: types.CodeType) -> set[str]:
    """Global names a function's body reads (its nested functions and comprehensions included)."""
    out = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            out.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            out |= _loaded_names(const)
    return out


def _default_names(src: str) -> set[str]:
    """Names read by the default arguments of the `def` (evaluated where the def runs)."""
    fn = ast.parse(src).body[0]
    exprs = list(fn.args.defaults) + [d for d in fn.args.kw_defaults if d is not None]
    return {n.id for e in exprs for n in ast.walk(e) if isinstance(n, ast.Name)}


def _where(obj) -> str:
    return inspect.getsourcefile(obj).rsplit("/kernels/", 1)[-1]


def math_source() -> tuple[str, list[str]]:
    """(source text, the names it defines): constants first, then functions, dependencies first."""
    import importlib

    funcs: dict[str, object] = {}
    consts: dict[str, tuple[object, str]] = {}
    order: list[object] = []

    def visit(fn) -> None:
        name = fn.__name__
        if name in funcs:
            if funcs[name] is not fn:
                raise GenerationError(f"two kernels helpers are named {name} ({fn.__module__}, "
                                      f"{funcs[name].__module__}): the script has one namespace")
            return
        funcs[name] = fn
        src = textwrap.dedent(inspect.getsource(fn))
        if not src.startswith("def "):
            raise GenerationError(f"{fn.__module__}.{name} is decorated or not a plain function")
        for g in sorted(_loaded_names(fn.__code__) | _default_names(src)):
            if g not in fn.__globals__:
                continue  # a builtin, or a local the default walk saw
            obj = fn.__globals__[g]
            if inspect.isfunction(obj) and obj.__module__.startswith("kernels"):
                visit(obj)
            elif isinstance(obj, (bool, int, float, str)) and not isinstance(obj, type):
                if g in consts and consts[g][0] != obj:
                    raise GenerationError(f"two kernels constants named {g} differ")
                consts[g] = (obj, fn.__module__)
            elif inspect.ismodule(obj) and PROVIDED.get(g) == obj.__name__:
                continue
            else:
                raise GenerationError(f"{fn.__module__}.{name} reads {g} ({type(obj).__name__}), which the "
                                      "standalone script cannot carry without importing the suite")
        order.append(fn)

    for module, name in ROOTS:
        visit(getattr(importlib.import_module(module), name))
    lines = ["# ---- generated: do not edit here; these are the suite's `kernels/` references, copied in by",
             "# ---- `repro report` (repro/report/standalone/generate.py), dependencies first.", ""]
    for g, (value, module) in sorted(consts.items()):
        lines.append(f"{g} = {value!r}  # {module}")
    for fn in order:
        lines += ["", "", f"# {_where(fn)}", textwrap.dedent(inspect.getsource(fn)).rstrip()]
    return "\n".join(lines) + "\n", sorted(consts) + [f.__name__ for f in order]


def _body(name: str, text: str) -> str:
    """A part as the script carries it: without its own docstring (which tells this repository's
    reader what the part is), save the head's, which is the script's."""
    if name == PARTS[0]:
        return text
    first = ast.parse(text).body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        raise GenerationError(f"the template part {name}.py.in lost its docstring")
    return "\n".join(text.splitlines()[first.end_lineno:])


def template() -> str:
    """The script's template: its parts joined in order, two blank lines apart (top-level code's
    spacing), the markers not yet filled in."""
    parts = [_body(name, (PARTS_DIR / f"{name}.py.in").read_text()).strip("\n") for name in PARTS]
    return "\n\n\n".join(parts) + "\n"


def render_script(spec: dict) -> str:
    """The template with the generated math and `spec` (the steps, shapes, knobs) filled in."""
    template_text = template()
    for marker in (SPEC_MARKER, MATH_MARKER, "@TITLE@", "@NEEDS@"):
        if marker not in template_text:
            raise GenerationError(f"the standalone template lost its marker {marker!r}")
    math, _ = math_source()
    text = template_text.replace(MATH_MARKER, math.rstrip(), 1)
    text = text.replace(SPEC_MARKER, "SPEC_JSON = " + repr(json.dumps(spec, separators=(",", ":"))), 1)
    text = text.replace("@NEEDS@", needs(spec), 1)
    return text.replace("@TITLE@", spec["title"].replace('"""', "'''"), 1)


def needs(spec: dict) -> str:
    """What the script imports, in words: safetensors only when its weights lie beside it."""
    if spec["weights"]["source"] == "file":
        return f"torch and safetensors (its weights, {spec['weights']['file']}, lie beside it)"
    return "only torch"


def script_options() -> dict:
    """The options the template rebuilds (its OPTION_DEFAULTS), read from the template itself so
    the list is written once."""
    tree = ast.parse(template())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["OPTION_DEFAULTS"]:
            return ast.literal_eval(node.value)
    raise GenerationError("the standalone template lost OPTION_DEFAULTS")
