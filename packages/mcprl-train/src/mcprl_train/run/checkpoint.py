"""Atomic, verified checkpoints with a ``latest`` pointer and keep-last-K pruning.

Layout of ``<run>/checkpoints/``::

    step-00000010/              one complete checkpoint (``step-00000010-r1`` if step 10 is saved again)
      policy/                   whatever a writer put there (e.g. `mcprl_policy.Policy.save_pretrained`)
      optimizer.pt, scheduler.pt, ...   one torch file per entry of ``state_dicts``
      rng.pt                    python / numpy / torch / cuda RNG states
      meta.json                 {"step": ..., <caller's meta: data position, stage, ...>}
      manifest.json             {"step", "files": {relpath: {"sha256", "size"}}} — written last
    latest                      "<dir name> <sha256 of its manifest.json>" — updated after the rename
    .tmp-*/                     a write in progress or cut by a crash (ignored, removed by the next save)

Write protocol (`CheckpointManager.save`): everything goes to a fresh ``.tmp-*`` directory; every file is
fsynced while its sha256 is computed; ``manifest.json`` is written and fsynced last; the directory is renamed
into place and the parent fsynced; only then is ``latest`` replaced (temp file + fsync + ``os.replace``).
A crash at any point leaves ``latest`` naming the previous complete checkpoint.

Load protocol (`CheckpointManager.load_latest`): try the checkpoint ``latest`` names, then every other one
from newest to oldest; a candidate whose files do not match its manifest (or whose manifest does not match
the pointer's hash) is skipped with a ``checkpoint_invalid`` warning. The result says which one was used and
which were skipped.

In a multi-process run only rank 0 calls `save` (after any collective gather); every rank may `load`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import structlog
import torch

from mcprl_train.errors import CheckpointError

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "atomic_write",
    "capture_rng_state",
    "fsync_dir",
    "restore_rng_state",
]

logger = structlog.get_logger()

MANIFEST = "manifest.json"
META = "meta.json"
RNG = "rng"
LATEST = "latest"
_NAME = re.compile(r"^step-(\d{8,})(?:-r(\d+))?$")


def capture_rng_state() -> dict[str, Any]:
    """The RNG states of python, numpy (if installed), torch CPU and every CUDA device."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:  # numpy is optional
        pass
    else:
        state["numpy"] = np.random.get_state()
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore states captured by `capture_rng_state` (CUDA states only when CUDA is available)."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@attrs.frozen(kw_only=True)
class Checkpoint:
    """A complete, verified checkpoint on disk.

    Attributes:
        path: Its directory.
        step: The training step it was saved at.
        meta: The caller's ``meta`` plus ``step``.
        skipped: Newer checkpoints that failed verification before this one was chosen (name → reason).
    """

    path: Path
    step: int
    meta: dict[str, Any]
    skipped: dict[str, str] = attrs.field(factory=dict[str, str])

    def subdir(self, name: str) -> Path:
        """The directory a writer filled (e.g. ``"policy"``)."""
        return self.path / name

    def has_state(self, name: str) -> bool:
        return (self.path / f"{name}.pt").is_file()

    def state(self, name: str) -> dict[str, Any]:
        """A state dict saved under ``name`` (tensors on the CPU).

        Raises:
            CheckpointError: no such state in this checkpoint.
        """
        path = self.path / f"{name}.pt"
        if not path.is_file():
            raise CheckpointError(f"checkpoint {self.path.name} has no state {name!r}")
        # The file's sha256 was verified against the manifest when the checkpoint was loaded.
        return torch.load(path, map_location="cpu", weights_only=False)

    def restore_rng(self) -> None:
        """Restore the RNG states saved with the checkpoint."""
        restore_rng_state(self.state(RNG))


class CheckpointManager:
    """Saves checkpoints atomically under ``root`` and loads the newest verified one.

    Args:
        root: The checkpoints directory (created on first save).
        keep: How many complete checkpoints to keep (older ones are removed after a save).
    """

    def __init__(self, root: str | Path, *, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root)
        self.keep = keep

    # -- save -----------------------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        writers: Mapping[str, Callable[[Path], object]] | None = None,
        state_dicts: Mapping[str, Any] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> Checkpoint:
        """Write a checkpoint of ``step`` with the current RNG states atomically and point ``latest`` at it.

        Args:
            step: The training step (names the directory).
            writers: ``name → fn(directory)``; each fills ``<checkpoint>/<name>/`` (e.g. ``save_pretrained``).
            state_dicts: ``name → object`` saved with `torch.save` as ``<name>.pt`` (optimizer, scheduler...).
            meta: JSON-able data (data position, stage...) stored in ``meta.json``.

        Returns:
            The checkpoint as `load` would return it.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_partial()
        tmp = self.root / f".tmp-step-{step:08d}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        for name, write in (writers or {}).items():
            _check_name(name)
            (tmp / name).mkdir()
            write(tmp / name)
        for name, value in (state_dicts or {}).items():
            _check_name(name)
            torch.save(value, tmp / f"{name}.pt")
        torch.save(capture_rng_state(), tmp / f"{RNG}.pt")
        full_meta = {**(meta or {}), "step": int(step)}
        (tmp / META).write_text(json.dumps(full_meta, indent=2, sort_keys=True, default=str) + "\n")
        files = {str(p.relative_to(tmp)): _hash_and_sync(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        manifest = {"format": 1, "step": int(step), "created": time.time(), "files": files}
        manifest_bytes = (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()
        _write_synced(tmp / MANIFEST, manifest_bytes)
        for directory in sorted((p for p in tmp.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            fsync_dir(directory)
        fsync_dir(tmp)
        final = self.root / self._free_name(step)
        os.rename(tmp, final)
        fsync_dir(self.root)
        self._point_latest(final.name, hashlib.sha256(manifest_bytes).hexdigest())
        logger.info("checkpoint_saved", step=step, path=str(final), files=len(files))
        self._prune(final)
        return Checkpoint(path=final, step=int(step), meta=full_meta)

    def _free_name(self, step: int) -> str:
        base = f"step-{step:08d}"
        names = itertools.chain([base], (f"{base}-r{revision}" for revision in itertools.count(1)))
        return next(name for name in names if not (self.root / name).exists())

    def _point_latest(self, name: str, manifest_sha: str) -> None:
        atomic_write(self.root / LATEST, f"{name} {manifest_sha}\n".encode())

    def _prune(self, newest: Path) -> None:
        complete = self.directories()
        same_step = [p for p in complete if p != newest and _order(p)[0] == _order(newest)[0]]
        older = [p for p in complete if p != newest and p not in same_step]
        doomed = same_step + older[: max(0, len(older) - (self.keep - 1))]
        for path in doomed:
            trash = self.root / f".tmp-trash-{path.name}-{time.monotonic_ns()}"
            os.rename(path, trash)  # a crash mid-delete leaves a .tmp-* directory, never a half checkpoint
            shutil.rmtree(trash, ignore_errors=True)
            logger.debug("checkpoint_removed", path=str(path))

    def _remove_partial(self) -> None:
        for path in self.root.glob(".tmp-*"):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    # -- load -----------------------------------------------------------------------------------------------

    def directories(self) -> list[Path]:
        """Checkpoint directories (complete or not), oldest first by (step, revision)."""
        if not self.root.is_dir():
            return []
        return sorted((p for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name)), key=_order)

    def latest_pointer(self) -> tuple[str, str] | None:
        """``(directory name, manifest sha256)`` from ``latest``, or None when absent/unreadable."""
        try:
            name, sha = (self.root / LATEST).read_text().split()
        except (OSError, ValueError):
            return None
        return name, sha

    def load(self, path: str | Path, *, expected_manifest_sha: str | None = None) -> Checkpoint:
        """Load and verify one checkpoint directory.

        Raises:
            CheckpointError: missing/corrupt manifest, missing file, size or checksum mismatch.
        """
        root = Path(path)
        try:
            manifest_bytes = (root / MANIFEST).read_bytes()
            manifest = json.loads(manifest_bytes)
            files: dict[str, dict[str, Any]] = manifest["files"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"{root.name}: no readable {MANIFEST} ({exc})") from exc
        if (
            expected_manifest_sha is not None
            and hashlib.sha256(manifest_bytes).hexdigest() != expected_manifest_sha
        ):
            raise CheckpointError(f"{root.name}: {MANIFEST} does not match the hash recorded in {LATEST}")
        for rel, entry in files.items():
            file = root / rel
            if not file.is_file():
                raise CheckpointError(f"{root.name}: file {rel} is missing")
            if file.stat().st_size != entry["size"] or _sha256(file) != entry["sha256"]:
                raise CheckpointError(f"{root.name}: checksum mismatch in {rel}")
        meta = json.loads((root / META).read_text())
        return Checkpoint(path=root, step=int(manifest["step"]), meta=meta)

    def load_latest(self) -> Checkpoint | None:
        """The newest checkpoint that verifies, or None when there is no checkpoint at all.

        Raises:
            CheckpointError: checkpoints exist but none verifies.
        """
        pointer = self.latest_pointer()
        candidates = list(reversed(self.directories()))
        if pointer is not None:
            named = self.root / pointer[0]
            candidates = [named, *[c for c in candidates if c != named]] if named.is_dir() else candidates
        skipped: dict[str, str] = {}
        if pointer is not None and not (self.root / pointer[0]).is_dir():
            skipped[pointer[0]] = "named by latest but missing"
        for candidate in candidates:
            sha = pointer[1] if pointer is not None and candidate.name == pointer[0] else None
            try:
                loaded = self.load(candidate, expected_manifest_sha=sha)
            except CheckpointError as exc:
                skipped[candidate.name] = str(exc)
                logger.warning("checkpoint_invalid", path=str(candidate), reason=str(exc))
                continue
            if skipped:
                logger.warning("checkpoint_fallback", used=candidate.name, skipped=sorted(skipped))
            return attrs.evolve(loaded, skipped=skipped)
        if skipped:
            raise CheckpointError(f"no checkpoint in {self.root} verifies: {skipped}")
        return None


def _order(path: Path) -> tuple[int, int]:
    match = _NAME.match(path.name)
    assert match is not None
    return int(match.group(1)), int(match.group(2) or 0)


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*", name) or name in (MANIFEST, META, RNG):
        raise ValueError(f"invalid checkpoint entry name {name!r}")


def _sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _hash_and_sync(path: Path) -> dict[str, Any]:
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())
    return {"sha256": _sha256(path), "size": path.stat().st_size}


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old file or the new one, never a mix.

    The data goes to a temp file beside ``path``, is fsynced, renamed over ``path`` (``os.replace``), and the
    directory is fsynced so the rename itself survives a crash.
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    _write_synced(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename/creation inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
