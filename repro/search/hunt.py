"""Hypothesis hunting over request sequences: the search (`hunt`), its budget of distinct
sequences (`Budget`), the profiles, and a shrinking move Hypothesis does not make (`merge_pass`).
`repro hunt` itself (its config, outputs and lines) is `repro.commands.hunt`.

Hypothesis shrinks every distinct failure it meets (a divergence, and an exception the check
raised: `Crash`) and reports them together; `hunt` returns each, shrunk, as a `Failure`. With
several graph modes to search, the mode is part of what each example draws.

Profiles are registered when asked (`register_profiles`), not at import, and every database lives
under the cache directory (`repro.io.cache_dir`), never in the working directory."""
from __future__ import annotations

import dataclasses
import functools
import json
import traceback
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import Flaky

from ..errors import BadInput
from ..io import cache_dir
from ..scheduler.sequence import Sequence
from .strategies import sequences as sequence_strategy
from .strategies import size_of

PROFILES = ("ci", "dev", "soak")
DEFAULT_MAX_EXAMPLES = 60  # without --profile and without --max-examples


def database(cache=None) -> DirectoryBasedExampleDatabase:
    """The Hypothesis database under the cache (`cache`: `io.cache_dir`'s root). Hypothesis's other
    files (the `constants/` cache its local-constants draws keep, the `.gitignore` it writes beside)
    go to the same folder: its home defaults to `.hypothesis` in the working directory. The folder is
    made here: Hypothesis makes it only when it first writes, which a short search may never do (a
    local-constants draw is random)."""
    home = cache_dir(cache) / "hypothesis"
    home.mkdir(parents=True, exist_ok=True)
    set_hypothesis_home_dir(home)
    return DirectoryBasedExampleDatabase(str(home))


def register_profiles(cache=None) -> None:
    """ci (derandomised, 25 examples, no database), dev (150) and soak (5000)."""
    common = dict(deadline=None, suppress_health_check=list(HealthCheck), database=database(cache))
    settings.register_profile("ci", max_examples=25, derandomize=True, print_blob=False,
                              **{**common, "database": None})
    settings.register_profile("dev", max_examples=150, **common)
    settings.register_profile("soak", max_examples=5000, **common)


class FlakyHunt(Exception):
    """Hypothesis saw a failure that did not repeat on the same sequence: nondeterminism, which
    the command line reports in one line with exit 1 (something is wrong, not the input)."""


class Crash:
    """A failure that is no divergence: the check raised (an IndexError in the runner, say), which
    is a fault of the suite or the stack on that sequence. It has no step, only a line naming the
    exception and where it was raised."""

    step = None

    def __init__(self, error: BaseException):
        self.error = error
        frames = traceback.extract_tb(error.__traceback__)
        self.where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else "?"

    def line(self) -> str:
        return f"crash: {type(self.error).__name__}: {self.error} (raised at {self.where})"


@dataclass
class Failure:
    """One distinct failure a hunt shrank: the minimal sequence, what it found there (a divergence,
    a finding or a `Crash`: each has `line()` and `step`) and the graph mode it ran in (None: the
    one mode the check knows)."""
    seq: Sequence
    found: object
    mode: str | None = None

def example_count(max_examples: int | None, profile: str | None) -> int:
    """An explicit --max-examples wins; else the profile's own count (soak: 5000); else 60."""
    if max_examples is not None:
        return max_examples
    if profile is not None:
        register_profiles()  # the counts only: the database it names is not opened here
        return settings.get_profile(profile).max_examples
    return DEFAULT_MAX_EXAMPLES


_ONCE = object()  # a sequence that has run once (`Budget`)


class Budget:
    """The distinct sequences a hunt may run: the search and its shrinking together
    (`--max-examples`).

    Wraps the check: a sequence seen before runs once more without counting (Hypothesis replays the
    shrunk example, and a failure that does not repeat must still be seen as flaky), and after that
    is answered as that run was (the shrinker may reach one sequence by many paths); once `total`
    distinct sequences have run, any new one is answered "no divergence" without running, so the
    shrinker keeps the smallest failure it has. `phase` is "searching" until the first failure,
    then "shrinking"; `progress(budget)` is called after each new sequence."""

    def __init__(self, check, total: int, progress=None):
        self.check, self.total, self.progress = check, total, progress
        self.spent = 0
        self.found_at: int | None = None  # the run that first failed
        self._seen: dict = {}  # sequence -> its last answer, once it has run twice

    @property
    def phase(self) -> str:
        return "searching" if self.found_at is None else "shrinking"

    def __call__(self, seq: Sequence, *more):
        key = json.dumps([dataclasses.asdict(seq), *more], sort_keys=True)
        if key in self._seen:
            if self._seen[key] is _ONCE:
                self._seen[key] = self.check(seq, *more)
            return self._seen[key]
        if self.spent >= self.total:
            return None
        self._seen[key] = _ONCE
        self.spent += 1
        div = None  # an interrupt (KeyboardInterrupt) leaves it unset: it passes through as it is
        try:
            div = self.check(seq, *more)
        except Exception:
            div = True  # a crash fails as a divergence does
            raise
        finally:
            if div is not None and self.found_at is None:
                self.found_at = self.spent
            if self.progress is not None:
                self.progress(self)
        return div


def hunt(check, max_examples: int | None = 60, profile: str | None = None, vocab: int = 512, num_slots: int = 4,
         max_requests: int = 5, max_tokens: int = 8, max_prompt: int | None = None, cache=None, progress=None,
         spec_tokens: int = 0, data_parallel: bool = False, block_size: int | None = None,
         modes: tuple[str, ...] | None = None) -> list[Failure]:
    """Search sequences for those where `check(seq)` returns a divergence (or raises); return each
    distinct failure Hypothesis found, shrunk (`Failure`), the first it met first; none: []. With
    `modes`, each example also draws one of them (shrinking toward the first) and the check is
    `check(seq, mode)`. The sequences carry `spec_tokens` drafts a decode and,
    with `data_parallel`, an idle rank's dummy steps; with `block_size`, prefix caching and shared
    prefixes. At most `max_examples` sequences run, the search and
    the shrinking together (`Budget`); None: the profile's own count (so `--profile soak` means
    5000), or DEFAULT_MAX_EXAMPLES without a profile. `progress(budget)` after each sequence run.
    Raises FlakyHunt when a failure does not reproduce (nondeterminism is itself worth
    reporting, in one line); bad input and lack of memory pass through as they are."""
    found: list[tuple[Failure, BaseException]] = []
    base = _base_settings(profile, cache)
    budget = Budget(check, example_count(max_examples, profile), progress)
    # a derandomised search's seed is the source of the function it runs: kept as before block sizes
    sequences = functools.partial(sequence_strategy, block_size=block_size)

    drawn = sequences(max_requests, max_tokens, num_slots, vocab, max_prompt, spec_tokens, data_parallel)
    if modes:
        drawn = st.tuples(drawn, st.sampled_from(modes))
    else:
        drawn = drawn.map(lambda seq: (seq,))

    database(cache)  # Hypothesis's home under the cache, whichever profile (ci has no database)
    # quiet: the hunt prints its own minimal sequence; Hypothesis's reports (a falsifying example, or the
    # `@seed(...)` a SIGINT would print on stdout) name a test function the user never wrote
    @settings(base, max_examples=budget.total, deadline=None, suppress_health_check=list(HealthCheck),
              phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
              verbosity=Verbosity.quiet)
    @given(drawn)
    def prop(example):
        try:
            div = budget(*example)
        except (BadInput, MemoryError):
            raise
        except Exception as e:
            found.append((Failure(example[0], Crash(e), *example[1:]), e))
            raise
        if div is not None:
            err = AssertionError(div.line())
            found.append((Failure(example[0], div, *example[1:]), err))
            raise err

    try:
        prop()
    except Flaky as e:
        raise _flaky(found, e) from None
    except Exception as e:
        return [_merged(f, budget) for f in _minimal(found, e)]
    return []


def _base_settings(profile: str | None, cache) -> settings:
    """The named profile (registered now), or Hypothesis's defaults over the cache's database."""
    if profile is not None:
        register_profiles(cache)
        return settings.get_profile(profile)
    return settings(database=database(cache))


def _minimal(found: list[tuple[Failure, BaseException]], e: Exception) -> list[Failure]:
    """The failure recorded for each minimal example Hypothesis raised (`e`, or each in its group);
    FlakyHunt where one is Flaky; `e` as it is where one is no failure the hunt recorded."""
    group = getattr(e, "exceptions", None)  # an ExceptionGroup (the backport's on Python 3.10)
    errors = list(group) if isinstance(group, tuple) else [e]
    if any(isinstance(x, Flaky) for x in errors):
        raise _flaky(found, e) from None
    shrunk = []
    for x in errors:  # Hypothesis raises what its last run of each minimal example raised
        f = next((f for f, err in reversed(found) if err is x), None)
        if f is None:
            raise e
        shrunk.append(f)
    return shrunk


def _flaky(found, e) -> FlakyHunt:
    last = found[-1][0].found.line() if found else str(e).splitlines()[0]
    return FlakyHunt(f"hunt: a failure did not reproduce on the same sequence (nondeterministic): {last}")


def _merged(f: Failure, check) -> Failure:
    """A divergence's sequence after `merge_pass` (a crash is kept as Hypothesis shrank it)."""
    if isinstance(f.found, Crash):
        return f
    more = () if f.mode is None else (f.mode,)
    seq, div = merge_pass(f.seq, f.found, lambda s: check(s, *more))
    return Failure(seq, div, f.mode)


def merge_pass(seq: Sequence, div, check):
    """A domain move Hypothesis' shrinker does not make: fold one request's prompt into another's
    (same tokens in the step, one request fewer). Repeated while the divergence persists."""
    improved = True
    while improved and len(seq.requests) > 1:
        improved = False
        for i, j in [(i, j) for i in range(len(seq.requests)) for j in range(len(seq.requests)) if i != j]:
            reqs = [dataclasses.replace(r) for r in seq.requests]
            keep, drop = reqs[i], reqs[j]
            keep.prompt_len = min(seq.max_tokens, keep.prompt_len + drop.prompt_len)
            keep.decode_steps = max(keep.decode_steps, drop.decode_steps)
            by_rid = {r.rid: r for r in reqs if r is not drop}
            for r in reqs:  # a prefix of the dropped request's is no prefix any more; none outgrows a prompt
                if r.prefix_of is not None:
                    n = min(r.prefix_len, r.prompt_len, by_rid[r.prefix_of].prompt_len) if r.prefix_of in by_rid else 0
                    r.prefix_of, r.prefix_len = (r.prefix_of, n) if n else (None, 0)
            cand = dataclasses.replace(seq, requests=[r for k, r in enumerate(reqs) if k != j])
            d = check(cand)
            if d is not None and size_of(cand) <= size_of(seq):
                seq, div, improved = cand, d, True
                break
    return seq, div
