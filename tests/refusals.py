"""The bad-input contract checked from a test: one line on stderr, no traceback, exit 2."""
from repro.cli import main


def refused(capsys, argv, *needles) -> str:
    """Run `repro argv`; assert it is refused in one line naming each of `needles`; return the line."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err
