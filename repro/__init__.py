"""Graph-replay reproducer islands for Qwen3.6-35B-A3B W8A8 INT8."""
__version__ = "0.1.0"
