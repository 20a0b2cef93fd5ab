"""Finished trees kept on disk by every party, so a resumed or recovered forest never grows a
finished tree again.

One file per tree in the job's model folder, ``forest/tree-NNNNNN.json``: the job's digest (the
spec and the party's data: trees of another job or data are never taken), the tree's part this
party holds, and an HMAC-SHA256 under the party's checkpoint key over both, checked before the
content is used.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import shutil
from pathlib import Path
from typing import Any

from boosting.tree import write_json_atomic
from workers.checkpoint import CheckpointError

FOLDER = "forest"
_NAME = re.compile(r"tree-(\d{6})\.json")


def _tag(key: bytes, digest: str, tree: int, part: Any) -> str:
    payload = json.dumps({"digest": digest, "tree": tree, "part": part}, sort_keys=True)
    return hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()


def save_tree(model_dir: Path, key: bytes, digest: str, tree: int, part: Any) -> None:
    """Keep one finished tree's part (JSON-ready), tagged."""
    write_json_atomic(model_dir / FOLDER / f"tree-{tree:06d}.json",
                      {"digest": digest, "tree": tree, "part": part,
                       "hmac": _tag(key, digest, tree, part)})


def held_trees(model_dir: Path, digest: str) -> list[int]:
    """Trees of exactly this job this party holds (by file name and digest; the tag is checked
    when a tree is loaded)."""
    folder = model_dir / FOLDER
    held = []
    for path in sorted(folder.glob("tree-*.json")) if folder.is_dir() else []:
        match = _NAME.fullmatch(path.name)
        try:
            raw = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # half a file from a crash: that tree is grown again
        if match and isinstance(raw, dict) and raw.get("digest") == digest:
            held.append(int(match.group(1)))
    return held


def held_on_disk(model_dir: Path) -> int | None:
    """How many trees this party's folder holds by file name (None: none); not read, so not
    checked: for a hint, never for resuming."""
    folder = model_dir / FOLDER
    found = [p for p in folder.glob("tree-*.json")] if folder.is_dir() else []
    return len(found) or None


def load_tree(model_dir: Path, key: bytes, digest: str, tree: int) -> Any:
    """The part of one kept tree, after checking its tag."""
    path = model_dir / FOLDER / f"tree-{tree:06d}.json"
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"kept tree {tree}: cannot read {path.name}: {exc}") from None
    if (not isinstance(raw, dict) or raw.get("digest") != digest or raw.get("tree") != tree
            or not hmac.compare_digest(str(raw.get("hmac", "")),
                                       _tag(key, digest, tree, raw.get("part")))):
        raise CheckpointError(f"kept tree {tree}: {path.name} is not this job's or was altered "
                              f"(its tag does not match); start the job under a new name")
    return raw["part"]


def keep_only(model_dir: Path, trees: set[int]) -> None:
    """Delete kept trees not in ``trees`` (they are grown again)."""
    folder = model_dir / FOLDER
    for path in folder.glob("tree-*.json") if folder.is_dir() else []:
        match = _NAME.fullmatch(path.name)
        if not match or int(match.group(1)) not in trees:
            path.unlink(missing_ok=True)


def discard(model_dir: Path) -> None:
    """The forest is saved: its kept trees are no longer needed."""
    shutil.rmtree(model_dir / FOLDER, ignore_errors=True)
