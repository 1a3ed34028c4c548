"""The `Checkpoint`: open a directory (config, quant scheme, headers, index), name its tensors.

The class is assembled from mixins by concern: `layout.py` (expected tensors), `checks.py`
(validation against the quant scheme), `sharding.py` (TP-sharded loads); `files.py` reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import ConfigError, ModelConfig
from ...errors import CheckpointError
from ..quant import QuantScheme
from .checks import _Checks
from .files import (IGNORED_PREFIXES, INDEX_FILE, PREFIX_MULTIMODAL, PREFIX_TEXT, ReadStats, TensorInfo, _Reader,
                    check_index, read_header, shard_files)
from .layout import _Layout
from .sharding import _Loading


class Checkpoint(_Layout, _Checks, _Loading):
    """A checkpoint directory, opened lazily. Use `Checkpoint.open(path)`."""

    def __init__(self, path: Path, config: ModelConfig, quant: QuantScheme, infos: dict[str, TensorInfo],
                 ignored: dict[str, TensorInfo], index: dict[str, str] | None, prefix: str):
        self.path = path
        self.config = config
        self.quant = quant
        self.prefix = prefix
        self.stats = ReadStats()
        self._infos = infos
        self._ignored = ignored
        self._index = index  # weight_map of a sharded checkpoint, else None

    # -- opening

    @classmethod
    def open(cls, path: str | Path) -> "Checkpoint":
        """Parse config and headers; any file-system error (a directory without read permission)
        becomes a one-line CheckpointError naming the path."""
        try:
            return cls._open(Path(path))
        except OSError as e:
            raise CheckpointError(f"{e.filename or path}: cannot read ({e.strerror or e})") from e

    @classmethod
    def _open(cls, path: Path) -> "Checkpoint":
        if not path.exists():
            raise CheckpointError(f"{path}: checkpoint directory does not exist")
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a directory (a checkpoint is a directory with config.json)")
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise CheckpointError(f"{cfg_path}: missing (a checkpoint needs config.json)")
        try:
            raw = json.loads(cfg_path.read_text())
        except (OSError, ValueError) as e:
            raise CheckpointError(f"{cfg_path}: cannot parse ({e})") from e
        if not isinstance(raw, dict):
            raise CheckpointError(f"{cfg_path}: expected a JSON object")
        try:
            config = ModelConfig.from_hf(raw)
        except ConfigError as e:
            raise CheckpointError(f"{cfg_path}: {e}") from e
        qc = raw.get("quantization_config")
        if qc is None and isinstance(raw.get("text_config"), dict):
            qc = raw["text_config"].get("quantization_config")
        quant = QuantScheme.from_config(qc, source=str(cfg_path))

        index, shard_paths = shard_files(path)

        infos: dict[str, TensorInfo] = {}
        ignored: dict[str, TensorInfo] = {}
        for sp in shard_paths:
            for name, info in read_header(sp).items():
                (ignored if name.startswith(IGNORED_PREFIXES) else infos)[name] = info

        if index is not None:
            check_index(path, index, infos, ignored)
        want = PREFIX_MULTIMODAL if config.multimodal else PREFIX_TEXT
        other = PREFIX_TEXT if config.multimodal else PREFIX_MULTIMODAL
        if not any(n.startswith(want + "layers.") for n in infos):
            found = [n for n in infos if n.startswith(other + "layers.")]
            why = ("has text_config (multimodal)" if config.multimodal else "has no text_config (text-only)")
            hint = f"; the tensors are named {other}layers.* (e.g. {found[0]})" if found else ""
            raise CheckpointError(
                f"{cfg_path}: config {why}, so tensors should be named {want}layers.*, but none are{hint}")
        return cls(path, config, quant, infos, ignored, index, want)

    # -- names and metadata

    @property
    def files(self) -> list[Path]:
        return sorted({i.file for i in (*self._infos.values(), *self._ignored.values())})

    def names(self) -> list[str]:
        """Tensor names of the text model and head (visual and mtp tensors are left out)."""
        return list(self._infos)

    def has(self, name: str) -> bool:
        return name in self._infos

    def info(self, name: str) -> TensorInfo:
        try:
            return self._infos[name]
        except KeyError:
            pass
        if self._index is not None and name in self._index:
            raise CheckpointError(f"{self.path / self._index[name]}: tensor {name} is listed in {INDEX_FILE} "
                                  "for this file but the file does not contain it")
        where = ", ".join(str(f) for f in self.files)
        raise CheckpointError(f"{where}: tensor {name} is missing")

    def layer_prefix(self, layer: int) -> str:
        return f"{self.prefix}layers.{layer}."

    def read_tensor(self, name: str) -> torch.Tensor:
        """One tensor by its full name, read alone (e.g. the next layer's input norm)."""
        with _Reader(self) as rd:
            return rd.read(name)

    def total_bytes(self) -> int:
        return sum(i.nbytes for i in self._infos.values())

    def layer_bytes(self, layer: int) -> int:
        p = self.layer_prefix(layer)
        return sum(i.nbytes for n, i in self._infos.items() if n.startswith(p))

    def ignored_names(self) -> list[str]:
        return list(self._ignored)
