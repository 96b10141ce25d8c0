"""Is the culprit's build the same as its parent's? Then its verdict is noise or environment.

syzkaller flags a bisection result whose kernel build equals its parent's: the commit cannot have
changed the behaviour, so a flaky test or a changing machine made the verdicts differ. Here "the
build" is what the example can see: the files inside the wheel (not the zip bytes, which carry
timestamps, and not the dist-info metadata, which carries version strings) and the code the
example generated. `wheel_content_digest` reads a wheel; `identical_build` is pure.
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

from runner.ledger import Attempt


def wheel_content_digest(wheel: Path) -> str:
    """A digest of the wheel's package files (name and content), dist-info and bytecode left out."""
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as archive:
        for info in sorted(archive.infolist(), key=lambda i: i.filename):
            name = info.filename
            top = name.split("/", 1)[0]
            if info.is_dir() or top.endswith(".dist-info") or name.endswith(".pyc"):
                continue
            digest.update(name.encode() + b"\0")
            digest.update(hashlib.sha256(archive.read(info)).digest())
    return digest.hexdigest()


def identical_build(
    culprit: Attempt | None, parent: Attempt | None, package: str, generated: str | None
) -> bool:
    """Both attempts built ``package`` to the same files, every other wheel too, and generated
    the same code.

    The other wheel counts: a culprit that only moves the runtime pointer builds the same pypto
    wheel as its parent, but not the same simpler wheel. ``generated`` is the triage status of
    the two runs' generated code ("identical" only counts); without a recorded wheel content on
    either side there is no evidence, so False.
    """
    if culprit is None or parent is None or generated != "identical":
        return False
    if package not in culprit.wheel_contents:
        return False
    return culprit.wheel_contents == parent.wheel_contents
