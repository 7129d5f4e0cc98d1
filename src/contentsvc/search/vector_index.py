"""hnswlib snapshots of one vector generation and space.

A snapshot is `<space>-<position>.hnsw` plus `snapshot.json` naming it,
replaced atomically (write, fsync, rename). The vectors themselves live in
Postgres; a snapshot only saves re-indexing them after a restart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import hnswlib
import numpy as np

from contentsvc.search.embedding import DIMENSIONS
from contentsvc.search.engine_space import SPACE

EF_CONSTRUCTION = 200
M = 16
EF_SEARCH = 128


def new_index(capacity: int) -> hnswlib.Index:
    index = hnswlib.Index(space="cosine", dim=DIMENSIONS)
    index.init_index(max_elements=max(capacity, 1024), ef_construction=EF_CONSTRUCTION, M=M,
                     allow_replace_deleted=False)
    index.set_ef(EF_SEARCH)
    return index


def ensure_capacity(index: hnswlib.Index, extra: int) -> None:
    needed = index.get_current_count() + extra
    if needed > index.get_max_elements():
        index.resize_index(max(needed, index.get_max_elements() * 2))


@dataclass(frozen=True)
class Snapshot:
    position: int
    max_label: int
    file: str


def read_snapshot(directory: Path) -> Snapshot | None:
    meta = directory / "snapshot.json"
    if not meta.exists():
        return None
    data = json.loads(meta.read_text())
    if not (directory / data["file"]).exists():
        return None
    return Snapshot(data["position"], data["max_label"], data["file"])


def load(directory: Path, snapshot: Snapshot, extra: int = 0) -> hnswlib.Index:
    index = hnswlib.Index(space="cosine", dim=DIMENSIONS)
    index.load_index(str(directory / snapshot.file), max_elements=0)
    if extra:
        ensure_capacity(index, extra)
    index.set_ef(EF_SEARCH)
    return index


def save(directory: Path, index: hnswlib.Index, position: int, max_label: int) -> Snapshot:
    directory.mkdir(parents=True, exist_ok=True)
    name = f"{SPACE}-{position}.hnsw"
    index.save_index(str(directory / name))
    with open(directory / name, "rb+") as f:
        os.fsync(f.fileno())
    tmp = directory / "snapshot.json.tmp"
    tmp.write_text(json.dumps({"position": position, "max_label": max_label, "file": name}))
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    previous = read_snapshot(directory)
    os.replace(tmp, directory / "snapshot.json")
    # Keep the snapshot just replaced: a searcher may be loading it right now.
    keep = {name, previous.file if previous else name}
    for old in directory.glob(f"{SPACE}-*.hnsw"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    return Snapshot(position, max_label, name)


def to_bytes(vector: np.ndarray) -> bytes:
    return np.asarray(vector, dtype="<f4").tobytes()


def from_bytes(raw: bytes) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4")
