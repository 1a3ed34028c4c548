"""`repro inspect` and `repro run` agree on every damaged checkpoint of the test set: the same exit
code, and the same tensor named on stderr (a NaN, inf, negative or zero weight scale, a NaN norm
weight or `A_log`, and the damage kinds of `test_damage_property.py`). Problems go to stderr."""
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from repro.cli.app import main

L0 = "model.language_model.layers.0."
SCALE = L0 + "linear_attn.in_proj_z.weight_scale"


def _set(value):
    def damage(t, name):
        x = t[name].clone()
        x.view(-1)[0] = value
        t[name] = x
    return damage


def _drop(t, name):
    del t[name]


def _retype(t, name):
    t[name] = t[name].to(torch.int32) if t[name].is_floating_point() else t[name].to(torch.float32)


def _shape(t, name):
    t[name] = t[name][:-1].clone()


# (damage, tensor, exit code both must give)
DAMAGES = [
    (_set(float("nan")), SCALE, 2),
    (_set(float("inf")), SCALE, 2),
    (_set(-1.0), SCALE, 2),
    (_set(0.0), SCALE, 0),  # loadable: that output channel is always 0 (a warning, from both)
    (_set(float("nan")), L0 + "input_layernorm.weight", 2),
    (_set(float("nan")), L0 + "linear_attn.norm.weight", 2),
    (_set(float("nan")), L0 + "linear_attn.A_log", 2),
    (_set(float("nan")), L0 + "linear_attn.dt_bias", 2),
    (_set(float("nan")), L0 + "mlp.gate.weight", 2),
    (_set(float("nan")), "model.language_model.embed_tokens.weight", 2),
    (_drop, L0 + "linear_attn.conv1d.weight", 2),
    (_retype, L0 + "linear_attn.in_proj_qkv.weight", 2),
    (_shape, L0 + "post_attention_layernorm.weight", 2),
]


@pytest.mark.parametrize("damage, name, rc", DAMAGES, ids=[f"{d.__name__}-{n.rsplit('.', 2)[-2]}-{r}"
                                                           for d, n, r in DAMAGES])
def test_inspect_and_run_agree(tiny_path, tmp_path, capsys, damage, name, rc):
    d = tmp_path / "m"
    shutil.copytree(tiny_path, d)
    t = load_file(str(d / "model.safetensors"))
    damage(t, name)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})
    got = {}
    for cmd, argv in (("run", ["run", "--model", str(d), "--device", "cpu", "--island", "submod0", "--steps", "2"]),
                      ("inspect", ["inspect", str(d)])):
        code = main(argv)
        cap = capsys.readouterr()
        got[cmd] = code
        assert name in cap.err, (cmd, cap.err)
        assert "Traceback" not in cap.err
        if cmd == "inspect":
            assert name not in cap.out  # the problems are on stderr, not in the table
    assert got == {"run": rc, "inspect": rc}
