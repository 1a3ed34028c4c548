"""Outputs never harm what the user owns: JSON written through files and
symlinks, special files and unwritable places refused before any work, strict JSON, and report
directories that only lose what the suite wrote."""
import json
import os
import stat

import pytest

from repro import io
from repro.errors import BadInput


def test_write_json_keeps_a_symlink_and_writes_its_target(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    io.write_json(link, {"a": 1})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert json.loads(target.read_text()) == {"a": 1}


def test_write_json_replaces_an_existing_file_whole_keeping_its_mode(tmp_path):
    # written to a temporary file beside it and renamed over it: a reader sees the old file or the
    # new one, never half of it; the mode stays, and a hard link keeps the old content
    p = tmp_path / "r.json"
    p.write_text("old")
    os.chmod(p, 0o640)
    hard = tmp_path / "hard.json"
    os.link(p, hard)
    io.write_json(p, [1, 2])
    assert json.loads(p.read_text()) == [1, 2] and stat.S_IMODE(p.stat().st_mode) == 0o640
    assert hard.read_text() == "old"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["hard.json", "r.json"]


def test_a_new_file_gets_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        p = io.write_json(tmp_path / "new.json", {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    assert [f.name for f in p.parent.iterdir()] == ["new.json"]  # no temp file left


def test_a_fifo_is_refused_and_left_alone(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(BadInput, match="not a regular file"):
        io.check_output_file(fifo)
    with pytest.raises(BadInput, match="not a regular file"):
        io.write_json(fifo, {})
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)


def _file(t):
    (t / "f").write_text("x")
    return t / "f"


@pytest.mark.parametrize("make, match", [
    (lambda t: t, "is a directory"),
    (lambda t: _file(t) / "out.json", "not a directory"),
    (lambda t: _file(t) / "deeper" / "out.json", "not a directory"),
])
def test_unwritable_output_places_are_refused(tmp_path, make, match):
    with pytest.raises(BadInput, match=match):
        io.check_output_file(make(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_directory_is_refused(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(BadInput, match="permission denied"):
        io.check_output_file(ro / "out.json")


def test_json_is_strict_non_finite_floats_become_strings(tmp_path):
    p = io.write_json(tmp_path / "r.json", {"a": float("inf"), "b": [float("-inf"), float("nan")], "c": (1.5,)})
    text = p.read_text()
    assert "Infinity" not in text and "NaN" not in text
    d = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    assert d == {"a": "inf", "b": ["-inf", "nan"], "c": [1.5]}
    assert float(d["a"]) == float("inf")


def test_the_cache_is_read_from_the_environment_at_the_edge_only(tmp_path):
    from repro.cli import environ
    assert environ.cache({"REPRO_CACHE": ""}) is None and environ.cache({}) is None
    assert io.cache_dir(None) == io.Path.home() / ".cache" / "repro"
    assert io.cache_dir(environ.cache({"REPRO_CACHE": str(tmp_path)})) == tmp_path
    from repro.model import tiny
    assert tiny.cache_dir is io.cache_dir


def _report(src_dir, names):
    for n in names:
        (src_dir / n).write_text(n)


def test_a_non_empty_report_dir_is_refused_without_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    with pytest.raises(BadInput, match="not empty.*--force"):
        io.prepare_output_dir(out)
    assert (out / "mine.txt").read_text() == "keep"


def test_force_replaces_only_what_the_suite_wrote(tmp_path):
    out = tmp_path / "out"
    io.prepare_output_dir(out)
    s = io.staging_dir(out)
    _report(s, ["REPORT.md", "old-only.txt"])
    io.install_dir(s, out)
    (out / "mine.txt").write_text("keep")
    (out / "notes").mkdir()
    with pytest.raises(BadInput):
        io.prepare_output_dir(out)
    io.prepare_output_dir(out, force=True, names=["REPORT.md"])
    s = io.staging_dir(out)
    _report(s, ["REPORT.md"])
    io.install_dir(s, out)
    assert sorted(os.listdir(out)) == sorted([io.MANIFEST, "REPORT.md", "mine.txt", "notes"])
    assert (out / "mine.txt").read_text() == "keep"


def test_force_refuses_to_overwrite_a_users_file_of_the_same_name(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "REPORT.md").write_text("the user's")
    with pytest.raises(BadInput, match="not written by repro"):
        io.prepare_output_dir(out, force=True, names=["REPORT.md"])
    assert (out / "REPORT.md").read_text() == "the user's"


def test_dot_as_report_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert io.prepare_output_dir(".") == tmp_path
    (tmp_path / "x").write_text("x")
    with pytest.raises(BadInput, match="not empty"):
        io.prepare_output_dir(".")


def test_a_killed_runs_staging_folder_is_cleaned(tmp_path):
    out = tmp_path / "out"
    s = io.staging_dir(out)
    (s / "half").write_text("x")
    assert io.prepare_output_dir(out) == out  # only the stale staging folder: counts as empty
    assert os.listdir(out) == []
