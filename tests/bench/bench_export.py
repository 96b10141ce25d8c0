"""How long a warm source export takes: a synthetic tree of a few thousand files, and the sample.

Prints figures; asserts nothing (timings belong in benchmarks, not tests).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from runner.sample.histories import SampleSpec, git, make_sample
from runner.sources import SourceExporter


def synthetic_repo(root: Path, files: int) -> tuple[Path, str]:
    """A pypto-sized tree: `files` C++ sources spread over directories, one commit."""
    repo = root / "big"
    repo.mkdir()
    git(root, "init", "-q", str(repo))
    for index in range(files):
        path = repo / "src" / f"dir{index % 40:02d}" / f"file{index:05d}.cpp"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"// file {index}\nint f{index}() {{ return {index}; }}\n" * 20)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "big tree")
    return repo, git(repo, "rev-parse", "HEAD")


def timed_exports(exporter: SourceExporter, commit: str, scratch: Path, repeats: int) -> list:
    times = []
    for attempt in range(repeats + 1):
        dest = scratch / f"export{attempt}"
        started = time.perf_counter()
        exporter.export(commit, dest)
        elapsed = time.perf_counter() - started
        if attempt:  # the first export fills the mirror: not warm
            times.append(elapsed)
        shutil.rmtree(dest)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        root = Path(tmp)
        repo, head = synthetic_repo(root, args.files)
        sample = make_sample(root / "sample", SampleSpec())
        rows = []
        for name, source, commit in (
            (f"{args.files} files, no submodules", repo, head),
            ("sample pypto, 3 submodules", sample.pypto, sample.pypto_shas[-1]),
        ):
            exporter = SourceExporter(source, root / f"cache-{len(rows)}")
            times = timed_exports(exporter, commit, root, args.repeats)
            rows.append((name, statistics.median(times), min(times), max(times)))
    print(f"{'warm export':40} {'median s':>9} {'min s':>7} {'max s':>7}")
    for name, median, low, high in rows:
        print(f"{name:40} {median:9.3f} {low:7.3f} {high:7.3f}")
    print("target: well under 1 s for a few thousand files")


if __name__ == "__main__":
    main()
