"""`make test`'s pytest: two processes side by side.

The tests that use the Docker Engine or the Ray cluster run one after another in one process:
they share the engine, judge what it holds before and after, count its events and time its
containers, so two of them at once would see each other's. The rest (git, the search, the
ledger, the CLI's bad input) run in a second process meanwhile; its output follows the first's.

pytest-xdist's `--dist loadgroup` did this until pytest 9.2, whose structured node ids ignore
the group suffix xdist writes: the Docker tests silently ran on both workers
(pytest-dev/pytest-xdist#1386).

    python -m tests.suite [pytest arguments]    # PYTEST_SPLIT=0: one process, as plain pytest
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence

ENGINE = "docker or ray"
NO_TESTS = 5  # pytest's exit code when nothing was collected


def split_markexpr(args: Sequence[str]) -> tuple[list[str], str | None]:
    """The arguments without their `-m` expression, and that expression (the last one wins, as
    in pytest)."""
    rest: list[str] = []
    expression = None
    items = iter(args)
    for arg in items:
        if arg == "-m":
            expression = next(items, "")
        elif arg.startswith("-m") and not arg.startswith("--"):
            expression = arg[2:].removeprefix("=")
        else:
            rest.append(arg)
    return rest, expression


def sides(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """pytest arguments of the engine's process and of the other one."""
    rest, given = split_markexpr(args)
    user = f"({given}) and " if given else ""
    return [*rest, "-m", f"{user}({ENGINE})"], [*rest, "-m", f"{user}not ({ENGINE})"]


def combined(codes: Sequence[int]) -> int:
    """One exit code for both processes: the first failure's; "no tests" only when neither
    collected any."""
    failed = [code for code in codes if code not in (0, NO_TESTS)]
    if failed:
        return failed[0]
    return NO_TESTS if all(code == NO_TESTS for code in codes) else 0


def main(args: Sequence[str]) -> int:
    pytest = [sys.executable, "-m", "pytest"]
    if os.environ.get("PYTEST_SPLIT") == "0":
        return subprocess.call([*pytest, *args])
    engine, other = sides(args)
    with tempfile.TemporaryFile() as output:
        beside = subprocess.Popen([*pytest, *other], stdout=output, stderr=subprocess.STDOUT)
        codes = []
        try:
            codes.append(subprocess.call([*pytest, *engine]))
        finally:
            codes.append(beside.wait())  # a Ctrl-C reaches both: it ends too
            output.seek(0)
            sys.stdout.flush()
            print(f"\n=== the tests without the Docker Engine or Ray (-m {other[-1]!r}) ===")
            sys.stdout.flush()
            sys.stdout.buffer.write(output.read())
            sys.stdout.flush()
    return combined(codes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
