"""Verdict inputs outside the bisected repositories are pinned by content, not by path."""

from __future__ import annotations

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
