"""Property: damaged inputs never crash the suite. Hypothesis damages a copy of
the tiny checkpoint (truncate, flip bytes of the header length, drop or retype a tensor, a NaN, a
wrong shape) and a valid sequence file (wrong types, out-of-range values, missing keys). For each:
exit 2, one line on stderr naming the file and the field, no traceback, the input unchanged and
nothing written outside the output path. In-process `main()`; few examples by default (the `ci`
profile's derandomised budget below), more with REPRO_HYPOTHESIS_PROFILE=dev."""
import contextlib
import copy
import hashlib
import io as _io
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from repro.cli.app import main
from repro.scheduler.sequence import random_sequence

L0 = "model.language_model.layers.0."
USED = [L0 + n for n in ("input_layernorm.weight", "post_attention_layernorm.weight",
                         "linear_attn.in_proj_qkv.weight", "linear_attn.in_proj_qkv.weight_scale",
                         "linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.conv1d.weight",
                         "linear_attn.norm.weight", "linear_attn.out_proj.weight", "mlp.gate.weight",
                         "mlp.experts.3.down_proj.weight", "mlp.shared_expert.up_proj.weight_scale")]
USED += ["model.language_model.embed_tokens.weight", "model.language_model.norm.weight"]
FEW = settings(max_examples=12, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))


def _digest(d: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def _main(argv):
    err, out = _io.StringIO(), _io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        rc = main(argv)
    return rc, err.getvalue()


def _check(work: Path, damaged: Path, argv, *needles):
    before_in, before_dir = _digest(damaged) if damaged.is_dir() else damaged.read_bytes(), sorted(os.listdir(work))
    out = work / "out.json"
    rc, err = _main(argv + ["--json", str(out)])
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, (n, err)
    assert (_digest(damaged) if damaged.is_dir() else damaged.read_bytes()) == before_in  # input unchanged
    assert sorted(os.listdir(work)) == before_dir  # nothing written, not even the output


def _damage_tensor(f: Path, kind: str, name: str):
    t = load_file(str(f))
    x = t[name]
    if kind == "drop":
        del t[name]
    elif kind == "retype":
        t[name] = x.to(torch.int32) if x.is_floating_point() else x.to(torch.float32)
    elif kind == "nan":
        x = x.clone() if x.is_floating_point() else x.to(torch.bfloat16)
        x.view(-1)[0] = float("nan")
        t[name] = x
    elif kind == "shape":
        t[name] = x[:-1].clone()
    save_file(t, str(f), metadata={"format": "pt"})


@FEW
@given(kind=st.sampled_from(["drop", "retype", "nan", "shape", "truncate", "flip"]),
       name=st.sampled_from(USED), where=st.floats(0.0, 0.999), mask=st.integers(1, 255), byte=st.integers(0, 7))
def test_a_damaged_checkpoint_is_one_line_exit_2(tiny_path, kind, name, where, mask, byte):
    if kind == "nan" and not name.endswith(("layernorm.weight", "A_log", "dt_bias", "norm.weight", "_scale",
                                            "gate.weight", "embed_tokens.weight", "conv1d.weight")):
        kind = "shape"  # int8 weights hold no NaN: damage their shape instead
    with tempfile.TemporaryDirectory() as w:
        work = Path(w)
        d = work / "ck"
        shutil.copytree(tiny_path, d)
        f = d / "model.safetensors"
        if kind == "truncate":
            data = f.read_bytes()
            f.write_bytes(data[: int(len(data) * where)])
            needles = [str(f)]
        elif kind == "flip":
            data = bytearray(f.read_bytes())
            data[byte] ^= mask
            f.write_bytes(bytes(data))
            needles = [str(f)]
        else:
            _damage_tensor(f, kind, name)
            needles = [name] if kind != "drop" else [name.rsplit(".", 1)[0]]
        _check(work, d, ["run", "--model", str(d), "--device", "cpu", "--island", "submod0", "--steps", "2"],
               *needles)


def _paths(doc, prefix=()):
    """(path, leaf key) of every value: dicts by key, lists by index."""
    out = []
    items = doc.items() if isinstance(doc, dict) else enumerate(doc)
    for k, v in items:
        p = prefix + (k,)
        out.append(p)
        if isinstance(v, (dict, list)) and v:
            out += _paths(v, p)
    return out


def _key(path) -> str:
    return next(k for k in reversed(path) if isinstance(k, str))


REQUIRED = {"rid", "prompt_len", "decode_steps", "step", "request_ids", "slots", "query_lens",
            "has_initial_state", "token_ids"}
OPTIONAL_NONE = {"max_steps", "preempt_after"}


def _doc():
    seq = random_sequence(0, num_requests=3, num_slots=4, max_tokens=8, vocab=512)
    return seq.to_json()


@FEW
@given(data=st.data(), how=st.sampled_from(["delete", "type", "range"]))
def test_a_damaged_sequence_file_is_one_line_exit_2(tiny_path, data, how):
    doc = _doc()
    candidates = [p for p in _paths(doc) if _key(p) != "seed"]
    if how == "delete":
        candidates = [p for p in candidates if isinstance(p[-1], str) and p[-1] in REQUIRED]
    elif how == "range":
        candidates = [p for p in candidates if isinstance(_get(doc, p), int) and not isinstance(_get(doc, p), bool)]
    path = data.draw(st.sampled_from(candidates))
    bad = copy.deepcopy(doc)
    parent = _get(bad, path[:-1])
    if how == "delete":
        del parent[path[-1]]
    elif how == "range":
        parent[path[-1]] = -1000
    else:
        old = parent[path[-1]]
        choices = ["x", 1.5, {"a": 1}] + ([] if _key(path) in OPTIONAL_NONE else [None])
        choices += [[1]] if not isinstance(old, list) else []
        choices += [True] if not isinstance(old, bool) else [3]
        parent[path[-1]] = data.draw(st.sampled_from(choices))
    with tempfile.TemporaryDirectory() as w:
        work = Path(w)
        f = work / "seq.json"
        f.write_text(json.dumps(bad))
        _check(work, f, ["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0",
                         "--sequence", str(f)], str(f), _key(path))


def _get(doc, path):
    for k in path:
        doc = doc[k]
    return doc
