"""Where the suite writes, and how: the one cache directory, output paths checked before any work
starts, JSON written without harming what the user owns, and report directories that only ever
lose what the suite itself put there.

Why a module of its own: the command line, the bench and the hunt all write results, and when
each kept its own helper they imported one another (a cycle) and disagreed (two `cache_dir`s).
Everything here raises `BadInput` (exit 2, one line) naming the option and the path.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import stat
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


def _nearest_existing(p: Path) -> Path:
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    return q


def _check_creatable(p: Path, what: str) -> None:
    """`p` does not exist: its nearest existing ancestor must be a directory we may write into."""
    anc = _nearest_existing(p.parent)
    if not anc.is_dir():
        raise BadInput(f"{what} {p}: {anc} is not a directory")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise BadInput(f"{what} {p}: cannot create files in {anc} (permission denied)")


def check_output_file(path, what: str = "--json") -> Path:
    """Refuse, before the work starts, an output file the suite could not write or must not
    replace: a directory, a device, FIFO or socket (`/dev/full`, `/dev/null`), a file without
    write permission, or a place whose parent cannot hold a new file. Symlinks are judged by
    their target. Returns the path as given (a symlink stays a symlink when written)."""
    if path is None:
        return None
    p = Path(path)
    real = Path(os.path.realpath(p))
    try:
        st = os.stat(real)
    except (FileNotFoundError, NotADirectoryError):
        _check_creatable(real, what)
        return p
    except OSError as e:
        raise BadInput(f"{what} {p}: cannot check ({e.strerror})") from e
    if stat.S_ISDIR(st.st_mode):
        raise BadInput(f"{what} {p}: is a directory (give a file name)")
    if not stat.S_ISREG(st.st_mode):
        raise BadInput(f"{what} {p}: not a regular file (a device, FIFO or socket); refusing to write there")
    if not os.access(real, os.W_OK):
        raise BadInput(f"{what} {p}: not writable (permission denied)")
    return p


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


def write_json(path, obj, what: str = "--json") -> Path:
    """Write `obj` as strict JSON to `path` without harming what is there.

    - an existing regular file is written through (same inode: its mode, owner and hard links are
      kept), and a symlink stays a symlink: its target receives the content;
    - special files (devices, FIFOs, sockets) and directories are refused (`check_output_file`);
    - a new file is written to a temporary name beside it and renamed into place (a reader never
      sees half of it), with the mode `open` gives a new file: 0666 less the umask (0644 usually),
      not mkstemp's 0600.
    """
    text = dumps(obj)
    check_output_file(path, what)
    real = Path(os.path.realpath(path))
    try:
        if real.exists():
            with open(real, "r+") as f:
                f.truncate(0)
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            return Path(path)
        real.parent.mkdir(parents=True, exist_ok=True)
        tmp = real.parent / f".{real.name}.{uuid.uuid4().hex[:8]}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, real)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot write ({e.strerror or e})") from e
    return Path(path)


# --------------------------------------------------------------------------- report directories


def _manifest(d: Path) -> list[str]:
    try:
        names = json.loads((d / MANIFEST).read_text()).get("files", [])
    except (OSError, ValueError, AttributeError):
        return []
    return [n for n in names if isinstance(n, str) and n and "/" not in n and n not in (".", "..")]


def prepare_output_dir(path, force: bool = False, what: str = "--report", names=()) -> Path:
    """Check a report directory before the work starts; returns its absolute path.

    A missing directory must be creatable. An existing one must be empty, unless `force`: then
    `install_dir` replaces the entries the suite wrote there before (listed in its manifest) and
    keeps everything else. Nothing is removed here, so a run that fails loses nothing. `names`:
    the files about to be written; one of them already there and not the suite's is refused even
    with `force` (the user's file would be overwritten). Scratch folders a killed run left
    (`.repro-staging-*`) are the suite's and always removed. `-o .` works: the
    current directory is handled like any other.
    """
    p = Path(os.path.abspath(path))
    if not p.exists():
        if p.is_symlink():
            raise BadInput(f"{what} {path}: a dangling symlink")
        _check_creatable(p, what)
        return p
    if not p.is_dir():
        raise BadInput(f"{what} {path}: exists and is not a directory")
    if not os.access(p, os.W_OK | os.X_OK):
        raise BadInput(f"{what} {path}: not writable (permission denied)")
    try:
        entries = os.listdir(p)
    except OSError as e:
        raise BadInput(f"{what} {path}: cannot list ({e.strerror})") from e
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
    """A fresh scratch path inside `out` (created) for a writer that wants to build a directory
    atomically; `install_dir` moves its content into `out`."""
    out.mkdir(parents=True, exist_ok=True)
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
    out.mkdir(parents=True, exist_ok=True)
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
