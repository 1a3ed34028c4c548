"""Progress, as a person sees it: a line per case without a terminal, a bar that is
erased before the table on one."""
import io as _io

from repro.progress import for_cases


def test_without_a_terminal_one_line_per_case():
    s = _io.StringIO()
    p = for_cases(2, stream=s, tty=False)
    assert p.start("chain full stale-pad") is None
    p.finish("detected")
    p.start("chain full baseline")
    p.finish("ok")
    p.clear()
    lines = s.getvalue().splitlines()
    assert len(lines) == 2 and "\r" not in s.getvalue()
    assert lines[0].startswith("repro: [1/2] chain full stale-pad: detected")


def test_on_a_terminal_the_bar_is_erased_before_the_table():
    s = _io.StringIO()
    p = for_cases(1, stream=s, tty=True)
    cb = p.start("chain piecewise baseline")
    cb(5, 10)
    p.finish("ok")
    out = s.getvalue()
    assert "[1/1]" in out and "5/10" in out
    assert out.endswith("\r")  # the cursor is back at column 0 of a blank line
    last = out.rsplit("\r", 2)[-2]
    assert last.strip() == ""  # the bar was overwritten with blanks


def test_the_run_prints_a_line_per_case_to_a_pipe(tiny_path, capsys):
    from repro.cli.app import main
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--steps", "4"]) == 0
    err = capsys.readouterr().err
    assert "repro: [1/1] submod0 piecewise baseline: ok" in err
