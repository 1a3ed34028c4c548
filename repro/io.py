"""Where the suite writes, and how: the cache directory, one rule for every output path, JSON
read and written without harming what the user owns, and report directories that only ever lose
what the suite itself put there.

The rule for an output file (`--json`, `--trace`, `hunt --save`, `bench --json`, `bench --plot`):

- checked before the work (`check_output_file`): its folder must exist (it is never created) and
  take a new file (a probe file is created there and removed, which is what the final rename
  needs: this refuses `/proc/...`, read-only file systems and folders without permission, even
  for root, whom `os.access` answers yes); an existing target must be a regular file the user
  may write (directories, devices, FIFOs and sockets are refused); a dangling symlink is refused;
- written whole at the end (`write_text`, `write_json`, `write_with`), or streamed into a
  temporary file beside it while the work runs (`streamed`): a temporary file in the target's
  folder, renamed over the target when complete, so an interrupted run leaves the old file as it
  was. A symlink is written through (its final target is replaced, the link stays); an existing
  file keeps its mode (and owner, where the user may set it); a new one gets the umask's mode.

Why a module of its own: the command line, the bench and the hunt all write results, and when
each kept its own helper they imported one another (a cycle) and disagreed. Everything here
raises `BadInput` (exit 2, one line) naming the option and the path.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import sys
import textwrap
import uuid
from pathlib import Path

from .errors import BadInput

MANIFEST = ".repro-manifest.json"  # in a report directory: the names the suite wrote there
STAGING = ".repro-staging-"  # scratch folders inside a report directory while it is written


def cache_dir(root=None) -> Path:
    """The cache: `root` (the command line passes `$REPRO_CACHE`), or `~/.cache/repro` when it is
    None or empty. The embedded checkpoint, the Hypothesis database and saved hunts live here
    (never in the working directory)."""
    return Path(root).expanduser() if root else Path.home() / ".cache" / "repro"


# --------------------------------------------------------------------------- output files


def _target(path, what: str) -> Path:
    """The file a write to `path` replaces: `path` itself, or the end of its symlink chain."""
    p = Path(path)
    if not p.is_symlink():
        return p
    real = Path(os.path.realpath(p))
    if not real.exists() and not real.is_symlink():
        raise BadInput(f"{what} {path}: a dangling symlink (to {os.readlink(p)}); refusing to create its target")
    return real


def _probe(folder: Path, what: str, path) -> None:
    """Create and remove a file in `folder`: the one check that answers for /proc, read-only file
    systems and root alike whether the final rename can happen."""
    probe = folder / f".repro-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot write files in {folder} ({e.strerror or e})") from None
    os.close(fd)
    probe.unlink(missing_ok=True)


def _check_folder(folder: Path, what: str, path) -> None:
    """The folder a new file or directory goes into: there, a directory, and writable."""
    above = folder
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        raise BadInput(f"{what} {path}: {above} is not a directory")
    if above != folder:
        raise BadInput(f"{what} {path}: folder {folder} does not exist (create it first)")
    _probe(folder, what, path)


def check_output_file(path, what: str = "--json") -> Path | None:
    """Refuse, before the work starts, an output file the suite could not write or must not
    replace (the module docstring's rule). Returns the path as given (None for None)."""
    if path is None:
        return None
    real = _target(path, what)
    try:
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot check ({e.strerror or e})") from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise BadInput(f"{what} {path}: is a directory (give a file name)")
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"{what} {path}: not a regular file (a device, FIFO or socket); refusing to write there")
        if not os.access(real, os.W_OK):
            raise BadInput(f"{what} {path}: not writable (permission denied)")
    _check_folder(real.parent if str(real.parent) else Path("."), what, path)
    return Path(path)


def check_distinct(files, folders=()) -> None:
    """Refuse two outputs of one command on one path, before the work: `files` are (option, path)
    pairs, `folders` (option, path, the names written in it) triples; None paths are skipped. Two
    options naming one file (by any spelling: `./x`, a symlink) would leave only the last one
    written, and a file named as one a report folder will hold would be replaced by it."""
    seen: dict[str, tuple[str, object]] = {}
    for what, path in files:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            other, was = seen[real]
            raise BadInput(f"{what} {path}: the same file as {other} {was} (give each output its own path)")
        seen[real] = (what, path)
    for what, path, names in folders:
        if path is None:
            continue
        folder = os.path.realpath(path)
        for real, (other, was) in seen.items():
            if real == folder or (os.path.dirname(real) == folder and os.path.basename(real) in names):
                raise BadInput(f"{other} {was}: the same path as {what} {path} writes (give each output its own path)")


def check_output_folder(path, what: str) -> Path:
    """A new output folder's parent must exist, as an output file's folder must: repro never
    creates folders on the way (a typo in a parent would otherwise become a new tree)."""
    p = Path(os.path.abspath(path))
    if not p.exists():
        _check_folder(p.parent, what, path)
    return p


def _keep_mode(tmp: Path, real: Path) -> None:
    """The replacement keeps the old file's mode, and its owner where we may set it."""
    try:
        st = os.stat(real)
    except FileNotFoundError:
        return
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    with contextlib.suppress(OSError):
        os.chown(tmp, st.st_uid, st.st_gid)


@contextlib.contextmanager
def _replacing(path, what: str, suffix: str = ".tmp"):
    """Yields a fresh temporary path beside `path`'s target; renamed over the target when the
    block completes, removed when it raises (the target is then untouched)."""
    check_output_file(path, what)
    real = _target(path, what)
    tmp = real.parent / f".{real.name}.{uuid.uuid4().hex[:8]}{suffix}"
    try:
        yield tmp
        _keep_mode(tmp, real)
        os.replace(tmp, real)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise BadInput(f"{what} {path}: cannot write ({e.strerror or e})") from e
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def new_file_mode() -> int:
    """The mode `open` gives a new file here: 0666 less the umask (0644 usually)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _open_new(tmp: Path):
    # os.open with 0666: a new file gets the umask's mode (0644 usually), not mkstemp's 0600
    return os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "w")


def write_text(path, text: str, what: str = "--json") -> Path:
    """Write `text` to `path` whole (the module docstring's rule)."""
    with _replacing(path, what) as tmp:
        with _open_new(tmp) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_json(path, obj, what: str = "--json") -> Path:
    """Write `obj` as strict JSON (`dumps`) to `path` whole."""
    return write_text(path, dumps(obj), what)


def write_with(path, write, what: str, suffix: str = "") -> Path:
    """`write(tmp)` writes a temporary file beside `path` (e.g. a plot library saving to a file
    name; `suffix` keeps the extension it reads the format from), then it replaces `path`."""
    with _replacing(path, what, suffix) as tmp:
        write(tmp)
    return Path(path)


@contextlib.contextmanager
def streamed(path, what: str = "--trace"):
    """A file written while the work runs (the trace): lines go to a temporary file beside
    `path`, renamed over it when the block completes; an interrupt (SIGINT) or an error removes
    the temporary file and leaves the old `path` as it was. `path` None yields None."""
    if path is None:
        yield None
        return
    with _replacing(path, what) as tmp:
        with _open_new(tmp) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())


# --------------------------------------------------------------------------- JSON in and out


def read_json(path, what: str):
    """A JSON file, or BadInput naming `what` and the cause (missing, unreadable, not JSON, or
    nested deeper than the parser recurses)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise BadInput(f"{what} {path}: does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"{what} {path}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{what} {path}: not JSON ({e})") from None
    except RecursionError:
        raise BadInput(f"{what} {path}: nested too deeply to read (no result or sequence file is)") from None


def strict_json(obj):
    """A copy of `obj` that strict JSON parsers accept: non-finite floats become the STRINGS
    "inf", "-inf" and "nan" (not null: `float(x)` reads them back and the kind is kept; a
    max_abs of inf means a shape mismatch, not a missing value). Tuples become lists."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def dumps(obj) -> str:
    """Strict JSON text (see `strict_json`); unknown objects (paths, dtypes) become their str."""
    return json.dumps(strict_json(obj), indent=2, allow_nan=False, default=str) + "\n"


PIPE_WIDTH = 100  # the columns text wraps at when stdout is no terminal and $COLUMNS is unset (logs, pipes)
MIN_WIDTH = 40  # narrower than this, wrapped text would be a word a line


def text_width() -> int:
    """The columns printed text wraps at: $COLUMNS, else the terminal's, else PIPE_WIDTH
    (`shutil.get_terminal_size`), so a note never breaks mid-word in a narrow pane."""
    return max(MIN_WIDTH, shutil.get_terminal_size((PIPE_WIDTH, 24)).columns)


def wrap(text: str, label: str = "", indent: str | None = None) -> list[str]:
    """`text` over lines of `text_width()`, the first starting with `label` and the rest indented as
    deep (or by `indent`); words and hyphenated names are never split."""
    return textwrap.wrap(text, text_width(), initial_indent=label,
                         subsequent_indent=" " * len(label) if indent is None else indent,
                         break_long_words=False, break_on_hyphens=False) or [label.rstrip()]


def emit(text: str = "") -> None:
    """Print a line of the result to stdout. A reader that went away (`repro inspect | head -1`)
    is not an error: stdout is pointed at /dev/null and the command goes on, so its files are
    still written and its exit code still says what it found."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


# --------------------------------------------------------------------------- report directories


def _manifest(d: Path) -> list[str]:
    try:
        names = json.loads((d / MANIFEST).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError, RecursionError):
        return []
    return [n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")]


def prepare_output_dir(path, force: bool = False, what: str = "--report", names=()) -> Path:
    """Check a report directory before the work starts; returns its absolute path.

    A missing directory is created at the end, in a folder that must exist (never created) and
    take new entries. An existing one must be empty, unless `force`: then `install_dir` replaces
    the entries the suite wrote there before (listed in its manifest) and keeps everything else.
    Nothing is removed here, so a run that fails loses nothing. `names`: the files about to be
    written; one of them already there and not the suite's is refused even with `force` (the
    user's file would be overwritten). Scratch folders a killed run left (`.repro-staging-*`)
    are the suite's and always removed. `-o .` works: the current directory is handled like any
    other.
    """
    p = Path(os.path.abspath(path))
    if not p.exists():
        if p.is_symlink():
            raise BadInput(f"{what} {path}: a dangling symlink (to {os.readlink(p)})")
        _check_folder(p.parent, what, path)
        return p
    if not p.is_dir():
        raise BadInput(f"{what} {path}: exists and is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise BadInput(f"{what} {path}: not writable (permission denied)")
    try:
        entries = os.listdir(p)
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot list ({e.strerror})") from e
    _probe(p, what, path)
    for e in entries:
        if e.startswith(STAGING):
            shutil.rmtree(p / e, ignore_errors=True)
    entries = [e for e in entries if not e.startswith(STAGING)]
    if not entries:
        return p
    ours = set(_manifest(p)) | {MANIFEST}
    foreign = sorted(e for e in entries if e not in ours)
    if not force:
        listed = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise BadInput(f"{what} {path}: not empty ({listed}); pass --force to replace what repro wrote there "
                       "(other files are kept)")
    clash = sorted(set(foreign) & set(names))
    if clash:
        raise BadInput(f"{what} {path}: {clash[0]} is there and was not written by repro; refusing to overwrite it "
                       "even with --force")
    return p


def staging_dir(out: Path) -> Path:
    """A fresh scratch path inside `out` (created; its parent was checked to exist) for a writer
    that wants to build a directory atomically; `install_dir` moves its content into `out`."""
    out.mkdir(exist_ok=True)
    s = out / f"{STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    s.mkdir()
    return s


def install_dir(src: Path, out: Path) -> list[str]:
    """Move every entry of `src` into `out` (one rename each) and remove `src`. Entries the suite
    wrote into `out` before (its manifest) and does not write again are removed; any other entry
    is kept, and one whose name clashes with a new entry is refused, not overwritten. The
    manifest is written first, so a kill in between still leaves the new entries known as ours."""
    src, out = Path(src), Path(out)
    names = sorted(os.listdir(src))
    out.mkdir(exist_ok=True)
    old = set(_manifest(out))
    for n in names:
        if n not in old and (out / n).exists():
            raise BadInput(f"{out / n}: was not written by repro; not overwritten (the new one is in {src / n})")
    write_json(out / MANIFEST, {"written_by": "repro", "files": sorted(old | set(names))}, what="manifest")
    for n in sorted(old - set(names)):
        _remove(out / n)
    for n in names:
        if (out / n).is_dir() and not (out / n).is_symlink():
            shutil.rmtree(out / n)
        os.replace(src / n, out / n)
    write_json(out / MANIFEST, {"written_by": "repro", "files": names}, what="manifest")
    shutil.rmtree(src, ignore_errors=True)
    return names


def _remove(q: Path) -> None:
    if q.is_dir() and not q.is_symlink():
        shutil.rmtree(q, ignore_errors=True)
    else:
        q.unlink(missing_ok=True)
