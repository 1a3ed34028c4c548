"""What `repro bench` prints and draws: the table, the per-kernel profiles and the PNG (the
command itself is `repro.commands.bench`)."""
from __future__ import annotations

from ..errors import BadInput
from ..io import wrap, write_with
from .lockrates import format_rates
from .replay import TARGET_FLOOR_RATIO, TARGET_SPEEDUP, BenchResult, targets


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def _grid(rows: list[tuple]) -> list[str]:
    """Rows of cells (the first is the header) as aligned text: text columns left, numbers right."""
    widths = [max(len(x[i]) for x in rows) for i in range(len(rows[0]))]
    num = [i for i in range(len(widths)) if all(_numeric(x[i]) for x in rows[1:])]
    lines = ["  ".join(c.rjust(w) if i in num else c.ljust(w) for i, (c, w) in enumerate(zip(x, widths))).rstrip()
             for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines


def _numeric(cell: str) -> bool:
    return cell == "-" or cell.replace(".", "", 1).replace(",", "").isdigit()


def format_table(res: BenchResult) -> str:
    """Two tables, each readable in 80 columns: replay against eager and against the bandwidth floor
    (one row an island or chain mode and batch), then the repairs' costs (the runner's step with the
    repair over the step without, at baseline), then the summary lines."""
    replay = [("island", "mode", "B", "eager us", "replay us", "speedup", "floor us", "replay/floor")]
    repairs = [("mode", "B", "repair", "eager us", "replay us", "repair cost")]
    for r in res.rows:
        if r.repair is None:
            replay.append((r.island, r.mode or "-", str(r.batch), _f(r.eager_us), _f(r.replay_us),
                           _f(r.speedup, "{:.2f}"), _f(r.floor_us, "{:.2f}"), _f(r.floor_ratio, "{:.2f}")))
        else:
            repairs.append((r.mode or "-", str(r.batch), r.repair, _f(r.eager_us), _f(r.replay_us),
                            _f(r.repair_cost, "{:.3f}")))
    lines = _grid(replay) if len(replay) > 1 else []
    if len(repairs) > 1:
        lines += ([""] if lines else []) + _grid(repairs)
    said = ["speedup: eager/replay; replay/floor: replay over the time the step's bytes take at the copy bandwidth",
            f"copy bandwidth {res.bandwidth / 1e9:.1f} GB/s (read + write), {res.iters} samples a median, "
            f"provider {res.graph_provider} on {res.device}"]
    t = targets(res.rows)["chain_full_b1"]
    if t:
        said.append(f"target chain full B=1: replay/floor {t['replay_over_floor']:.2f} (<= {TARGET_FLOOR_RATIO:g}: "
                    f"{'met' if t['within_5x_of_floor'] else 'NOT met'}), eager/replay {t['eager_over_replay']:.1f} "
                    f"(>= {TARGET_SPEEDUP:g}: {'met' if t['replay_10x_faster_than_eager'] else 'NOT met'})")
    lines += [x for line in said for x in wrap(line)]
    if res.lockstep_rates:
        lines.append(format_rates(res.lockstep_rates))
    if res.tiny_rates:
        r = res.tiny_rates
        lines += wrap(f"CPU tiny: lockstep {r['lockstep_piecewise_steps_per_s']} steps/s piecewise, "
                      f"{r['lockstep_full_and_piecewise_steps_per_s']} steps/s full_and_piecewise; "
                      f"Hypothesis {r['hypothesis_examples_per_s']} examples/s ({r['hypothesis_examples']} examples)")
    return "\n".join(lines)


def format_profiles(res: BenchResult, top: int = 15) -> str:
    """The --profile breakdowns of the chain rows, one block each."""
    out = []
    for r in res.rows:
        p = r.profile
        if not p:
            continue
        unit = "ops" if p["what"].startswith("CPU") else "launches"
        out.append(f"profile chain {r.mode} B={r.batch}: {p['what']}, {p['total_us_per_replay']:.1f} us and "
                   f"{p['launches_per_replay']:g} {unit} per replay ({p['replays']} replays; replay timed "
                   f"{r.replay_us:.1f} us)")
        for k in p["kernels"][:top]:
            share = k["us_per_replay"] / p["total_us_per_replay"] if p["total_us_per_replay"] else 0.0
            out.append(f"  {k['us_per_replay']:9.2f} us  {share:6.1%}  x{k['calls_per_replay']:<5g} {k['name'][:90]}")
    return "\n".join(out)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or BadInput saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot needs matplotlib, which is not installed here: pip install matplotlib "
                       "(or pip install -e '.[plot]'), or leave --plot out") from None
    return plt


def plot(res: BenchResult, path) -> None:
    """Two panels: replay/eager and replay/floor, one group per island (chain per mode), one bar
    per batch size."""
    plt = pyplot()
    rows = [r for r in res.rows if r.repair is None]
    groups = []
    for r in rows:
        key = r.island if r.mode is None else f"chain {r.mode}"
        if key not in groups:
            groups.append(key)
    batches = sorted({r.batch for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(groups) + 3), 4.2))
    width = 0.8 / max(1, len(batches))
    for ax, (title, value) in zip(axes, (("replay / eager (lower is better)", lambda r: r.replay_us / r.eager_us),
                                         ("replay / bandwidth floor (1 = at the floor)", lambda r: r.floor_ratio))):
        for j, b in enumerate(batches):
            xs, ys = [], []
            for i, gname in enumerate(groups):
                r = next((r for r in rows if r.batch == b and (r.island if r.mode is None else f"chain {r.mode}") == gname),
                         None)
                if r is not None and value(r) is not None:
                    xs.append(i + (j - (len(batches) - 1) / 2) * width)
                    ys.append(value(r))
            ax.bar(xs, ys, width, label=f"B={b}")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=20, ha="right")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"repro bench: {res.device}, {res.graph_provider}", fontsize=10)
    fig.tight_layout()
    try:
        write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), "--plot", ".png")
    finally:
        plt.close(fig)
