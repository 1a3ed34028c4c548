"""An eager copy and a replay copy stepping together over scheduled steps, checked after every
step: the chain (`lockstep.py`; what a difference is: `classify.py`), the `moe` island alone
(`moe.py`), the check phase's strategies (`checks.py`) and where a step's time goes (`phases.py`)."""
from .checks import CHECKS
from .lockstep import Lockstep, LockstepResult, run_lockstep
from .moe import moe_copies, run_moe_lockstep
from .phases import PHASES, Phases

__all__ = ["CHECKS", "PHASES", "Lockstep", "LockstepResult", "Phases", "moe_copies", "run_lockstep",
           "run_moe_lockstep"]
