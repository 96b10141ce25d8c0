"""Verdict inputs outside the bisected repositories are pinned by content, not by path."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from runner.inputs import snapshot, tree_digest


def _tree(root: Path) -> Path:
    (root / "models" / "m").mkdir(parents=True)
    (root / "models" / "m" / "e.py").write_text("print('run')\n")
    (root / "models" / "m" / "golden.bin").write_bytes(b"\x00\x01")
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return root


def test_the_digest_follows_content_not_location_or_git_metadata(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one")
    two = tmp_path / "elsewhere" / "two"
    shutil.copytree(one, two)
    (two / ".git" / "HEAD").write_text("ref: refs/heads/other\n")
    (two / "models" / "m" / "__pycache__").mkdir()
    (two / "models" / "m" / "__pycache__" / "e.cpython-311.pyc").write_bytes(b"x")
    assert tree_digest(one) == tree_digest(two)

    (two / "models" / "m" / "golden.bin").write_bytes(b"\x00\x02")
    assert tree_digest(one) != tree_digest(two)


def test_a_snapshot_is_made_once_and_holds_the_tree_without_git(tmp_path: Path) -> None:
    lib = _tree(tmp_path / "lib")
    digest = tree_digest(lib)

    first = snapshot(lib, digest, tmp_path / "work")
    (lib / "models" / "m" / "e.py").write_text("print('edited later')\n")
    again = snapshot(lib, digest, tmp_path / "work")

    assert first == again
    assert (first / "models" / "m" / "e.py").read_text() == "print('run')\n"
    assert not (first / ".git").exists()
    assert tree_digest(first) == digest


def test_a_workdir_and_cache_inside_pypto_lib_are_no_part_of_it(tmp_path: Path) -> None:
    """A run started from the pypto-lib checkout keeps its workdir there by default: the
    snapshot must not hold itself, and the session's digest must not change with each run."""
    lib = _tree(tmp_path / "lib")
    workdir, cache = lib / "bisect-precision", lib / "cache"
    digest = tree_digest(lib, (workdir, cache))

    made = snapshot(lib, digest, workdir, (cache,))
    (cache / "wheels").mkdir(parents=True)
    (cache / "wheels" / "w.whl").write_bytes(b"wheel")
    (workdir / "ledger.json").write_text("{}\n")

    assert tree_digest(lib, (workdir, cache)) == digest == tree_digest(made)
    assert sorted(p.name for p in made.iterdir()) == ["models"]
    assert snapshot(lib, digest, workdir, (cache,)) == made
    assert tree_digest(lib) != digest  # without the exclusions they would count


def test_a_named_pipe_in_the_tree_is_left_out_instead_of_waited_on(tmp_path: Path) -> None:
    """Opening a pipe no process writes to waits for ever: `run` sat at "starting"."""
    lib = _tree(tmp_path / "lib")
    digest = tree_digest(lib)
    os.mkfifo(lib / "models" / "pipe")

    assert tree_digest(lib) == digest
    made = snapshot(lib, digest, tmp_path / "work")
    assert not (made / "models" / "pipe").exists()
    assert tree_digest(made) == digest
