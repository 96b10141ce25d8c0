"""What an example run reads besides the commits, pinned by content for the whole session.

The pypto-lib checkout, pto-isa and ptoas live outside the bisected repositories; if one of them
changes between two runs (an edited golden, an updated pto-isa), verdicts of one session would
silently mix two environments. Their content digests join the session's identity, and every run
mounts a read-only snapshot of the pypto-lib tree taken when the session's inputs were fixed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path

from runner.errors import InfrastructureError

# Never part of what an example reads: VCS data, caches and the output of earlier runs.
_SKIPPED_DIRS = frozenset({".git", "__pycache__", "build_output", ".pytest_cache", ".mypy_cache"})
SNAPSHOTS = "lib-snapshot"


def tree_digest(root: Path, exclude: Collection[Path] = ()) -> str:
    """sha256 over every file's relative path, mode bit for execution, and content.

    `exclude`: directories inside `root` that are not its content (the tool's own workdir or
    cache, when a run starts from inside pypto-lib: the snapshot would hold itself)."""
    digest = hashlib.sha256()
    root = Path(root)
    skipped = _inside(root, exclude)
    for directory, dirnames, filenames in os.walk(root):
        here = Path(directory)
        dirnames[:] = sorted(
            d for d in dirnames if d not in _SKIPPED_DIRS and (here / d).resolve() not in skipped
        )
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = here / name
            rel = path.relative_to(root).as_posix()
            try:
                if path.is_symlink():
                    digest.update(f"L {rel}\0{os.readlink(path)}\0".encode())
                    continue
                if _special(path):
                    continue
                executable = os.access(path, os.X_OK)
                digest.update(f"F {rel}\0{int(executable)}\0".encode())
                with path.open("rb") as handle:
                    for chunk in iter(lambda: handle.read(1 << 20), b""):
                        digest.update(chunk)
            except OSError as exc:
                raise InfrastructureError(f"cannot read {path}: {exc}") from exc
            digest.update(b"\0")
    return digest.hexdigest()


def _special(path: Path) -> bool:
    """A named pipe, socket or device node: no example's input, and opening a pipe that no
    process writes waits for ever. Left out of the digest and the snapshot."""
    try:
        return not stat.S_ISREG(path.lstat().st_mode) and not path.is_dir()
    except OSError:
        return False


def _inside(root: Path, paths: Collection[Path]) -> frozenset[Path]:
    """The resolved `paths` that lie inside `root` (the others cannot be met walking it)."""
    top = root.resolve()
    resolved = (Path(p).expanduser().resolve() for p in paths)
    return frozenset(p for p in resolved if p != top and p.is_relative_to(top))


def snapshot(lib: Path, digest: str, workdir: Path, exclude: Collection[Path] = ()) -> Path:
    """A copy of the pypto-lib tree with this digest under the workdir, made once; the
    directories of `exclude` (and the workdir) are left out, as `tree_digest` leaves them."""
    target = workdir / SNAPSHOTS / digest[:16]
    if target.is_dir():
        return target
    skipped = _inside(lib, [*exclude, workdir])
    patterns = shutil.ignore_patterns(*_SKIPPED_DIRS, "*.pyc")

    def ignore(directory: str, names: list[str]) -> set[str]:
        here = Path(directory)
        return set(patterns(directory, names)) | {
            n for n in names if (here / n).resolve() in skipped or _special(here / n)
        }

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{digest[:16]}-", dir=target.parent))
        shutil.copytree(lib, staging / "tree", symlinks=True, ignore=ignore)
        if tree_digest(staging / "tree") != digest:
            shutil.rmtree(staging, ignore_errors=True)
            raise InfrastructureError(
                f"{lib} changed while it was being copied; run again when it is quiet"
            )
        try:
            os.replace(staging / "tree", target)
        except OSError:
            if not target.is_dir():
                raise
        shutil.rmtree(staging, ignore_errors=True)
    except OSError as exc:
        raise InfrastructureError(f"cannot snapshot {lib} into {target.parent}: {exc}") from exc
    return target
