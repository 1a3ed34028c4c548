"""`repro` command line (`app`): argparse, then one call into the library per command."""
from .app import main

__all__ = ["main"]
