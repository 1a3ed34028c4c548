"""`repro bench`: the structure of its results, the bandwidth floor counted by hand on the tiny
config, and the command line writing JSON / PNG on the CPU quickly. No timing is asserted."""
import json
import sys

import pytest
import torch

from repro.bench import replay as bench, output as bench_cli, lockrates
from repro.cli.app import main
from repro.islands import Model

ROW_KEYS = {"island", "batch", "eager_us", "replay_us", "floor_us", "repair", "mode", "replay_over_eager",
            "replay_over_floor", "repair_cost"}


@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(tiny_path, "cpu")


def test_floor_counts_the_right_bytes_on_the_tiny_config(model):
    c = model.cfg
    # the tiny config's dimensions, written out: the sums below are by hand, not by walking tensors
    assert (c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
            c.linear_value_head_dim, c.linear_conv_kernel_dim, c.num_experts, c.num_experts_per_tok,
            c.moe_intermediate_size, c.shared_expert_intermediate_size) == (64, 2, 4, 16, 16, 4, 8, 2, 32, 32)
    assert model.weights.gdn.in_proj_qkv.scale.dtype == torch.float32  # W8A8: int8 weight + fp32 scale per row
    B = 3
    copy = model.copy(num_slots=B)
    bf16, f32 = 2, 4
    H, conv_dim, vdim = 64, 2 * 2 * 16 + 4 * 16, 4 * 16
    lin = lambda n, k: n * k + n * f32
    submod0 = B * H * bf16 + H * bf16 + lin(conv_dim, H) + lin(vdim, H) + lin(4, H) + lin(4, H)
    conv_row, ssm_row = conv_dim * 3 * bf16, 4 * 16 * 16 * f32
    gdn_core = conv_dim * 4 * bf16 + 4 * bf16 + 4 * bf16 + 2 * B * (conv_row + ssm_row)
    expert = lin(2 * 32, H) + lin(H, 32)
    used = 5
    moe = 8 * H * bf16 + used * expert + lin(2 * 32, H) + lin(H, 32) + H * bf16
    submod1 = 16 * bf16 + lin(H, vdim) + H * bf16 + moe + H * bf16
    f = lambda isl: bench.floor_bytes(isl, model.weights, model.head, model.next_norm, copy.cache, B, used)
    assert f("submod0") == submod0 == 3 * 128 + 128 + 8704 + 4352 + 272 + 272
    assert f("gdn_core") == gdn_core == 1024 + 16 + 2 * 3 * (768 + 4096)
    assert f("submod1") == submod1
    assert f("moe") == B * H * bf16 + H * bf16 + moe
    assert f("chain") == submod0 + gdn_core + submod1
    # the floor grows with the experts used, by one expert's bytes each
    assert bench.floor_bytes("moe", model.weights, model.head, model.next_norm, None, B, used + 1) - f("moe") == expert


def test_experts_used_are_the_distinct_routed_ones(model):
    torch.manual_seed(0)
    x = torch.randn(6, model.cfg.hidden_size).to(torch.bfloat16)
    logits = torch.nn.functional.linear(x, model.weights.moe.gate).float()
    top = torch.topk(torch.softmax(logits, -1), model.cfg.num_experts_per_tok, dim=-1).indices
    assert bench.routed_experts_used(model.weights.moe, x, model.cfg.num_experts_per_tok) == len(set(top.flatten().tolist()))


def test_repairs_that_run_at_baseline_per_mode():
    piecewise = bench.applicable_repairs("piecewise", False)
    full = bench.applicable_repairs("full", False)
    assert {"clone-outputs", "private-pool", "copy-inputs", "recapture"} <= set(piecewise)
    assert {"sanitize-pad", "recapture"} <= set(full)
    assert not any(r.startswith("eager-family=") for r in full)  # refused in full mode
    assert "declare" not in piecewise + full and "event-wait" not in piecewise  # no run-time path / needs streams


def test_bench_rows_targets_and_table(model):
    from repro.graphs import make_provider
    provider = make_provider("cpu")
    res = bench.run_bench(model.path, provider, islands=("moe",), batches=(1,), modes=("full",), iters=1, warmup=0)
    kinds = {(r.island, r.mode, r.repair) for r in res.rows}
    assert ("moe", None, None) in kinds and ("chain", "full", None) in kinds and ("chain", "full", "none") in kinds
    doc = res.to_json()
    assert {"device", "graph_provider", "torch", "checkpoint", "copy_bandwidth_GBps", "results", "targets"} <= set(doc)
    for row in doc["results"]:
        assert ROW_KEYS <= set(row) and row["eager_us"] > 0 and row["replay_us"] > 0
    chain = next(r for r in doc["results"] if r["island"] == "chain" and r["repair"] is None)
    assert chain["floor_us"] > 0 and chain["replay_over_floor"] == pytest.approx(chain["replay_us"] / chain["floor_us"], rel=1e-2)
    t = doc["targets"]["chain_full_b1"]
    assert set(t) >= {"within_5x_of_floor", "replay_10x_faster_than_eager"}
    table = bench_cli.format_table(res)
    assert "replay/floor" in table and "target chain full B=1" in table


def test_cli_writes_json_and_png_on_cpu(tiny_path, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    rc = main(["bench", "--device", "cpu", "--model", tiny_path, "--batches", "1,2", "--iters", "1", "--warmup", "0",
               "--no-tiny-rates", "--quiet", "--json", str(out), "--plot", str(png)])
    assert rc == 0
    d = json.loads(out.read_text())
    islands = {(r["island"], r["batch"]) for r in d["results"]}
    assert {(i, b) for i in ("submod0", "gdn_core", "submod1", "moe", "chain") for b in (1, 2)} <= islands
    assert {r["mode"] for r in d["results"] if r["island"] == "chain"} == {"full", "piecewise"}
    assert any(r["repair"] == "clone-outputs" and r["repair_cost"] for r in d["results"])
    assert "repro bench" in d["command"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "eager/replay" in capsys.readouterr().out


def test_cli_json_without_matplotlib(tiny_path, tmp_path):
    out = tmp_path / "b.json"
    assert main(["bench", "--device", "cpu", "--model", tiny_path, "--island", "gdn_core", "--batches", "1",
                 "--iters", "1", "--warmup", "0", "--no-tiny-rates", "--quiet", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["island"], r["batch"]) for r in rows] == [("gdn_core", 1)]


def test_plot_without_matplotlib_is_a_clear_error(tiny_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc = main(["bench", "--device", "cpu", "--model", tiny_path, "--batches", "1", "--plot", str(tmp_path / "p.png")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and "pip install" in err
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--batches", "1,x"], "--batches"),
    (["--batches", "0"], "in 1..512"),
    (["--island", "nope"], "unknown island"),
    (["--kernels", "moe=nope"], "nope"),
])
def test_bad_input_exits_2(argv, message, tiny_path, capsys):
    assert main(["bench", "--device", "cpu", "--model", tiny_path] + argv) == 2
    assert message in capsys.readouterr().err


def test_tiny_rates_structure():
    r = lockrates.tiny_rates(steps=12, examples=2)
    assert r["lockstep_piecewise_steps"] > 0 and r["lockstep_full_and_piecewise_steps"] > 0
    assert r["lockstep_piecewise_steps_per_s"] > 0 and r["hypothesis_examples"] >= 1
    assert r["hypothesis_examples_per_s"] > 0


def test_clock_and_bandwidth_on_cpu():
    clock = bench.Clock("cpu", iters=3, warmup=1)
    assert clock(lambda: torch.ones(10).sum()) > 0
    assert bench.copy_bandwidth("cpu", nbytes_=1 << 20, iters=3) > 0


def test_kernel_profile_of_a_chain_replay_on_cpu(model):
    """--profile: the ops one replay runs, per replay, largest first; they add up to the total."""
    from repro.graphs import make_provider
    provider = make_provider("cpu")
    res = bench.run_bench(model.path, provider, islands=(), repairs=False, batches=(1,), modes=("full",),
                          iters=1, warmup=0, profile=3)
    row = next(r for r in res.rows if r.island == "chain")
    prof = row.profile
    assert prof and prof["replays"] == 3
    names = [k["name"] for k in prof["kernels"]]
    assert any("rms_norm" in n for n in names) and any("moe" in n for n in names)
    times = [k["us_per_replay"] for k in prof["kernels"]]
    assert times == sorted(times, reverse=True) and all(t >= 0 for t in times)
    assert prof["total_us_per_replay"] == pytest.approx(sum(times) + prof["rest_us_per_replay"], rel=1e-3)
    assert all(k["calls_per_replay"] > 0 for k in prof["kernels"])
    assert "profile chain full B=1" in bench_cli.format_profiles(res)
    assert res.to_json()["results"][0]["profile"]["replays"] == 3


def test_lockstep_rates_structure(model):
    """`--lockstep-rates`: per case and check, steps/s and where a step's time goes; hunt rate."""
    from repro.graphs import make_provider
    from repro.bench.lockrates import format_rates, lockstep_rates
    r = lockstep_rates(model, make_provider("cpu"), steps=8, examples=1,
                       cases=(("chain", "full"), ("moe", "piecewise")))
    assert [(c["island"], c["mode"], c["check"]) for c in r["cases"]] == [
        ("chain", "full", "device"), ("chain", "full", "host"), ("chain", "full", "reference"),
        ("chain", "full", "unchecked"),
        ("moe", "piecewise", "device"), ("moe", "piecewise", "host"), ("moe", "piecewise", "reference"),
        ("moe", "piecewise", "unchecked")]
    for c in r["cases"]:
        assert c["steps"] == 8 and not c["diverged"] and c["run_steps_per_s"] > 0
        assert set(c["fractions"]) == {"prepare", "eager", "replay", "compare", "weights", "read", "oracle",
                                       "reference"}
        assert (c["us_per_step"]["reference"] > 0) == (c["check"] == "reference" and c["island"] != "moe")
        assert c["steady_steps"] + c["captures"] >= c["steps"] and c["us_per_step"]["eager"] > 0
    assert r["hunt"]["examples"] >= 1 and r["hunt"]["examples_per_s"] > 0
    assert "steps/s" in format_rates(r) and "hunt:" in format_rates(r)
    assert r["host_us_per_op"] > 0 and "host speed" in format_rates(r)


def test_lockstep_rates_at_several_cadences_of_the_third_copy(model):
    """`every`: one reference row per cadence, each with the third copy's own step count (steps
    0, N, 2N, ... of the run), so what a cadence costs is read off one run; the moe island has no
    third copy and keeps one row."""
    from repro.graphs import make_provider
    from repro.bench.lockrates import format_rates, lockstep_rates
    r = lockstep_rates(model, make_provider("cpu"), steps=9, examples=0, checks=("reference",), every=(1, 4),
                       cases=(("chain", "piecewise"), ("moe", "piecewise")))
    rows = [(c["island"], c["reference_every"], c["reference_steps"]) for c in r["cases"]]
    assert rows == [("chain", 1, 9), ("chain", 4, 3), ("moe", None, 0)]
    assert all(c["steps"] == 9 and not c["diverged"] for c in r["cases"])
    table = format_rates(r)
    assert "reference/4" in table and "reference/1" in table


def test_each_lockstep_row_carries_the_host_speed_around_it_and_its_cost_in_small_op_times(model):
    """The host speed drifts within one run (6.4 to 11.9 us a small op in one GPU call), so each row
    measures it just before and just after itself; a row's `op_times` (1e6 / (steady steps/s x us
    per small op)) is the step's cost in small-op times: for a host-bound step, the same figure on a
    fast and a slow machine."""
    from repro.graphs import make_provider
    from repro.bench.lockrates import format_rates, lockstep_rates
    r = lockstep_rates(model, make_provider("cpu"), steps=6, examples=0, checks=("device",),
                       cases=(("chain", "full"), ("moe", "piecewise")))
    for c in r["cases"]:
        lo, hi = c["host_us_range"]
        assert 0 < lo and 0 < hi and c["host_us_per_op"] == round((lo + hi) / 2, 2)
        assert c["op_times"] == round(1e6 / (c["steady_steps_per_s"] * c["host_us_per_op"]))
    head = format_rates(r).splitlines()[0]
    assert "host us/op" in head and "op-times" in head


def test_the_unchecked_row_is_the_floor_the_check_sits_on(model):
    """`unchecked`: the same batches through the eager and the replay copy, one synchronisation a step
    and nothing compared, so what the check itself costs is read off one run (a checked row's op-times
    less its case's unchecked ones: the table's `check cost`). It runs the copies as the checked rows
    do (the same steps, the same graph captures) and no check phase at all."""
    from repro.graphs import make_provider
    from repro.bench.lockrates import format_rates, lockstep_rates
    r = lockstep_rates(model, make_provider("cpu"), steps=7, examples=0, checks=("device", "unchecked"),
                       cases=(("submod0", "piecewise"), ("moe", "piecewise")))
    rows = {(c["island"], c["check"]): c for c in r["cases"]}
    assert set(rows) == {("submod0", "device"), ("submod0", "unchecked"), ("moe", "device"), ("moe", "unchecked")}
    for island in ("submod0", "moe"):
        floor, checked = rows[(island, "unchecked")], rows[(island, "device")]
        assert floor["steps"] == checked["steps"] == 7 and floor["captures"] == checked["captures"] > 0
        assert not floor["diverged"] and floor["reference_steps"] == 0
        us = floor["us_per_step"]
        assert us["eager"] > 0 and us["replay"] > 0
        assert us["compare"] == us["weights"] == us["oracle"] == us["reference"] == 0
        assert checked["us_per_step"]["compare"] > 0
    table = format_rates(r)
    assert "unchecked" in table
    lines = table.splitlines()
    col = lines[0].index("check cost")
    want = rows[("submod0", "device")]["op_times"] - rows[("submod0", "unchecked")]["op_times"]
    cost = {tuple(x.split()[:3]): x[col:].split()[0] for x in lines[2:] if x.startswith(("submod0", "moe"))}
    assert cost[("submod0", "piecewise", "device")] == f"{want:+d}"
    assert cost[("submod0", "piecewise", "unchecked")] == "-"


def test_cli_lockstep_rates_in_the_json(tiny_path, tmp_path):
    out = tmp_path / "b.json"
    assert main(["bench", "--device", "cpu", "--model", tiny_path, "--island", "gdn_core", "--batches", "1",
                 "--iters", "1", "--warmup", "0", "--no-tiny-rates", "--quiet", "--json", str(out),
                 "--lockstep-rates", "--lockstep-steps", "3", "--hunt-examples", "0"]) == 0
    d = json.loads(out.read_text())
    assert {(c["island"], c["check"]) for c in d["lockstep_rates"]["cases"]} >= {("chain", "device"), ("moe", "host")}
    assert "--lockstep-rates" in d["command"]


def test_cli_reference_cadences_in_the_json_and_bad_ones_refused(tiny_path, tmp_path, capsys):
    out = tmp_path / "b.json"
    args = ["bench", "--device", "cpu", "--model", tiny_path, "--island", "gdn_core", "--batches", "1", "--iters", "1",
            "--warmup", "0", "--no-tiny-rates", "--quiet", "--lockstep-rates", "--lockstep-steps", "4",
            "--hunt-examples", "0"]
    assert main(args + ["--json", str(out), "--reference-every", "2,3"]) == 0
    d = json.loads(out.read_text())
    got = {(c["island"], c["reference_every"], c["reference_steps"]) for c in d["lockstep_rates"]["cases"]
           if c["check"] == "reference"}
    assert {("chain", 2, 2), ("chain", 3, 2), ("moe", None, 0)} <= got
    assert "--reference-every 2,3" in d["command"]
    capsys.readouterr()
    for bad in ("0", "2,x", ""):
        assert main(args + ["--reference-every", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--reference-every" in err[0], err


def _rate_row(island, check, steps_per_s, us, every=None):
    return {"island": island, "mode": "piecewise", "check": check, "reference_every": every,
            "steady_steps_per_s": steps_per_s, "run_steps_per_s": steps_per_s, "host_us_per_op": us,
            "op_times": round(1e6 / (steps_per_s * us)), "meets_target": steps_per_s >= 300,
            "fractions": {}, "timing": "device events"}


def test_the_rates_table_says_whether_the_target_holds_and_on_which_hosts():
    """The target at a glance: the device-check rows below 300 steps/s by name, the slowest host (us
    a small op) on which the one with the most op-times would still reach 300, and the same count
    for the rows with the third copy; host-check and unchecked rows do not count."""
    from repro.bench.lockrates import format_rates, target_line
    rows = [_rate_row("submod0", "device", 460.0, 6.2), _rate_row("chain", "device", 500.0, 6.0),
            _rate_row("submod0", "reference", 345.0, 8.5, 16), _rate_row("submod0", "host", 200.0, 6.2),
            _rate_row("submod0", "unchecked", 280.0, 6.2)]
    r = {"cases": rows, "device": "GPU", "provider": "cuda", "steps": 200}
    line = target_line(r)
    assert "checked steps/s (the device check): met by 2 of 2 rows;" in line and "below" not in line
    # submod0's device row has the most op-times (351): 300 steps/s needs a host of 1e6 / (300 * 351) us
    assert "351 (submod0 piecewise)" in line and f"{1e6 / (300 * 351):.1f} us" in line
    assert line.endswith("with the third copy: met by 1 of 1 rows")
    assert line in format_rates(r)
    rows[0] = _rate_row("submod0", "device", 255.3, 9.37)
    rows[2] = _rate_row("submod0", "reference", 212.8, 8.5, 16)
    line = target_line(r)
    assert "met by 1 of 2 rows (below: submod0 piecewise device 255.3)" in line
    assert "with the third copy: met by 0 of 1 rows (below: submod0 piecewise reference/16 212.8)" in line
    assert target_line({"cases": [rows[2], rows[3], rows[4]]}) is None


def test_lockstep_rates_at_k_draft_tokens_beside_k0(model):
    """`--lockstep-rates --spec-tokens K`: each chain case runs again on the seed's sequence with K draft
    tokens a decode (its steps carry drafts), measured in the same run, and the table gives K's steady
    steps/s over K=0's; the other islands run at K=0 only."""
    from repro.graphs import make_provider
    from repro.bench.lockrates import format_rates, lockstep_rates, spec_ratios
    r = lockstep_rates(model, make_provider("cpu"), steps=12, examples=0, checks=("device", "reference"),
                       cases=(("chain", "full"), ("submod0", "piecewise")), spec_tokens=2)
    keys = {(c["island"], c["spec_tokens"], c["check"]) for c in r["cases"]}
    assert keys == {("chain", 0, "device"), ("chain", 2, "device"), ("chain", 0, "reference"),
                    ("chain", 2, "reference"), ("submod0", 0, "device"), ("submod0", 0, "reference")}
    assert all(not c["diverged"] and c["steps"] == 12 for c in r["cases"])
    ((island, mode, ratio, op_ratio),) = spec_ratios(r)
    assert island == "chain" and mode == "full" and ratio > 0 and op_ratio > 0
    k0, k2 = ({c["spec_tokens"]: c for c in r["cases"] if c["island"] == "chain" and c["check"] == "device"}[k]
              for k in (0, 2))
    assert op_ratio == round(k0["op_times"] / k2["op_times"], 3)  # K=0's op-times over K's: a speed ratio
    table = format_rates(r)
    assert "full K=2" in table and "the device check at K=2 runs" in table and "x in small-op times" in table


def test_cli_spec_tokens_needs_a_rate_that_uses_it(tiny_path, capsys):
    assert main(["bench", "--device", "cpu", "--model", tiny_path, "--spec-tokens", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--spec-tokens: only with --hunt-rates or --lockstep-rates" in err[0]
