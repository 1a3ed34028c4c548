"""pytest integration: island markers, --device/--model/--hazard options, Hypothesis profiles."""
from __future__ import annotations

import os

import pytest

ISLAND_MARKERS = ("submod0", "gdn_core", "submod1", "moe", "forced_comm")


def pytest_addoption(parser):
    g = parser.getgroup("repro")
    g.addoption("--device", default=os.environ.get("REPRO_DEVICE", "cpu"), help="cpu | cuda | xpu | auto")
    g.addoption("--model", default=os.environ.get("REPRO_MODEL"), help="checkpoint directory (default: tiny)")
    g.addoption("--hazard", action="append", default=[], help="restrict hazard tests to these")
    g.addoption("--hypothesis-profile-name", default=os.environ.get("REPRO_HYPOTHESIS_PROFILE", "ci"))
    g.addoption("--failure-log", default=None,
                help="append each failure's traceback to this file as it happens (kept when a run is cut short)")


def pytest_runtest_logreport(report):
    """`--failure-log`: a run on a lent GPU machine can be stopped at its time limit, and pytest
    (with xdist) then prints no tracebacks; written here as each failure arrives, they survive."""
    path = getattr(pytest_runtest_logreport, "path", None)
    if path and report.failed and not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: the controller writes
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def pytest_configure(config):
    pytest_runtest_logreport.path = config.getoption("--failure-log")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:  # xdist: each worker's torch would take every core (8 workers x 16 threads on 16 cores)
        import torch
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    from repro.search.hunt import register_profiles, settings
    register_profiles(_cache())  # ci / dev / soak (not registered at import)
    settings.load_profile(config.getoption("--hypothesis-profile-name"))
    _no_local_constants()


def _no_local_constants() -> None:
    """Hypothesis draws some values (5% of draws) from the literals of the local modules loaded so
    far (`hypothesis.internal.conjecture.providers._get_local_constants`). A derandomised search
    would then generate other examples whenever a literal anywhere in `repro` changes, or when
    tests run in another order and import other modules first. Tests draw from Hypothesis's own
    constants alone, so a search depends on its test, its strategies and the Hypothesis version
    (pinned in the `test` extra). Hypothesis releases without local constants have nothing to pin."""
    from hypothesis.internal.conjecture import providers
    if hasattr(providers, "_get_local_constants"):
        providers._get_local_constants = providers.Constants


def pytest_collection_modifyitems(config, items):
    slow = "slow" in (config.getoption("-m") or "")
    for item in items:
        for name in ISLAND_MARKERS:
            if item.get_closest_marker(name) and name not in item.keywords:
                item.add_marker(name)
        if item.get_closest_marker("slow") and not slow:  # long searches stay out of the default run
            item.add_marker(pytest.mark.skip(reason="a long search: run it with -m slow"))


def _cache():
    """The tests' cache: `$REPRO_CACHE` as the command line reads it (None: ~/.cache/repro)."""
    from repro.cli import environ
    return environ.cache()


@pytest.fixture(scope="session")
def cache():
    return _cache()


@pytest.fixture(scope="session")
def device(request):
    from repro.graphs import resolve_device
    dev = resolve_device(request.config.getoption("--device"))
    if dev.startswith("cuda"):
        import torch
        if not torch.cuda.is_available():
            pytest.skip("needs an NVIDIA GPU (--device cuda)")
    if dev.startswith("xpu"):
        import torch
        if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
            pytest.skip("needs an Intel GPU (--device xpu)")
    return dev


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory, request):
    explicit = request.config.getoption("--model")
    if explicit:
        return explicit
    from repro.model.tiny import make_tiny
    return str(make_tiny(tmp_path_factory.mktemp("ckpt") / "tiny", seed=0))


@pytest.fixture(scope="session")
def hazard_filter(request):
    return request.config.getoption("--hazard")
