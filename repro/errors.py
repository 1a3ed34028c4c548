"""Errors the command line turns into exit code 2 (bad input), with a message naming the culprit."""


class BadInput(ValueError):
    """Input the suite cannot use: a checkpoint, a name, a device or an option. CLI exit 2."""


class CheckpointError(BadInput):
    """A checkpoint directory, file or tensor that is missing or malformed."""


class DeviceUnavailable(BadInput):
    """A device or graph provider that was asked for and is not there."""


class Refused(BadInput):
    """A knob (hazard, repair, mode) that cannot apply here; refused rather than ignored."""


class ReplayRefused(Exception):
    """The runner's own assertion stopped a replay it knows would read stale metadata (vLLM PR
    #55123's replay-side check): a loud error in place of silent corruption, reported as a finding."""
