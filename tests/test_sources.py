"""Source export: each sample commit exports whole and offline; the checkout stays untouched."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runner.config import Settings, load_settings
from runner.errors import BadInput, SourceUnavailable
from runner.history import History, pointer_states
from runner.prepare import _skipped, _skips_outside, _unrelated_clones
from runner.sample.histories import (
    ISA_PATH,
    LIBBACKTRACE_PATH,
    RUNTIME_PATH,
    Sample,
    SampleSpec,
    git,
)
from runner.sources import ExportResult, SourceExporter
from tests.fixtures.samples import SampleFactory, checkout_state

NESTED_ISA = f"{RUNTIME_PATH}/{ISA_PATH}"


@pytest.fixture
def exporter(sample: Sample, tmp_path: Path) -> SourceExporter:
    return SourceExporter(sample.pypto, tmp_path / "cache")


def tree(repo: Path, sha: str) -> dict[str, tuple[str, str]]:
    """path -> (mode, object) of every entry of a commit, read from an upstream as the oracle."""
    listing = git(repo, "ls-tree", "-r", "-z", sha)
    entries = {}
    for record in listing.split("\0"):
        if record:
            meta, _, path = record.partition("\t")
            mode, _kind, obj = meta.split()
            entries[path] = (mode, obj)
    return entries


def assert_exported(dest: Path, repo: Path, sha: str) -> dict[str, str]:
    """The files under `dest` are exactly `sha`'s tree (content, mode, symlinks); returns gitlinks.

    Content is compared as git blob ids, so every file is checked with one hash-object call.
    """
    expected = tree(repo, sha)
    gitlinks = {path: obj for path, (mode, obj) in expected.items() if mode == "160000"}
    files = {path: entry for path, entry in expected.items() if path not in gitlinks}
    found = []
    for directory, dirnames, filenames in os.walk(dest):
        rel_dir = Path(directory).relative_to(dest).as_posix()
        if rel_dir in gitlinks:
            dirnames.clear()
            continue
        found += [name if rel_dir == "." else f"{rel_dir}/{name}" for name in filenames]
        found += [
            f"{rel_dir}/{name}".removeprefix("./")
            for name in dirnames
            if (Path(directory) / name).is_symlink()
        ]
    assert sorted(found) == sorted(files)
    regular = [path for path, (mode, _) in files.items() if mode != "120000"]
    hashed = subprocess.run(
        ["git", "hash-object", "--no-filters", "--stdin-paths"],
        input="".join(f"{dest / path}\n" for path in regular),
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert dict(zip(regular, hashed, strict=True)) == {path: files[path][1] for path in regular}
    for path, (mode, _) in files.items():
        exported = dest / path
        if mode == "120000":
            target = git(repo, "cat-file", "blob", files[path][1])
            assert exported.is_symlink() and os.readlink(exported) == target
        else:
            assert bool(exported.stat().st_mode & 0o100) == (mode == "100755"), path
    for path in gitlinks:
        assert (dest / path).is_dir()
    return gitlinks


def test_every_commit_exports_with_every_submodule_at_its_pin(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    spec = sample.spec
    for index, sha in enumerate(sample.pypto_shas):
        dest = tmp_path / "out" / str(index)
        result = exporter.export(sha, dest)

        assert result.commit == sha and result.dest == dest
        gitlinks = assert_exported(dest, sample.mirrors["pypto"], sha)
        assert gitlinks.get(RUNTIME_PATH) == sample.gitlink(index)
        pinned_simpler = spec.pin(index)
        if pinned_simpler is None:
            assert RUNTIME_PATH not in result.submodules
            assert not (dest / RUNTIME_PATH).exists()
        else:
            pinned_sha = sample.simpler_shas[pinned_simpler]
            assert result.submodules[RUNTIME_PATH] == pinned_sha
            nested = assert_exported(dest / RUNTIME_PATH, sample.mirrors["simpler"], pinned_sha)
            has_isa = pinned_simpler >= spec.nested_submodule_at
            assert (ISA_PATH in nested) == has_isa == (NESTED_ISA in result.submodules)
            if has_isa:
                assert result.submodules[NESTED_ISA] == nested[ISA_PATH]
                assert_exported(
                    dest / NESTED_ISA, sample.mirrors["isa"], result.submodules[NESTED_ISA]
                )
        if index >= 1:
            # libbacktrace is found by name although its URL moved part-way.
            assert result.submodules[LIBBACKTRACE_PATH] == gitlinks[LIBBACKTRACE_PATH]
            assert_exported(
                dest / LIBBACKTRACE_PATH,
                sample.mirrors["libbacktrace"],
                gitlinks[LIBBACKTRACE_PATH],
            )
        expected = {path for path in (LIBBACKTRACE_PATH, RUNTIME_PATH) if path in gitlinks}
        if pinned_simpler is not None and pinned_simpler >= spec.nested_submodule_at:
            expected.add(NESTED_ISA)
        assert set(result.submodules) == expected


def test_exported_pypto_code_is_the_commits_own(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    last = len(sample.pypto_shas) - 1
    result = exporter.export(sample.pypto_shas[last], tmp_path / "head")
    for path in ("pyproject.toml", ".gitmodules", "pypto/__init__.py"):
        shown = git(sample.mirrors["pypto"], "show", f"{sample.pypto_shas[last]}:{path}")
        assert (result.dest / path).read_text().strip() == shown
    simpler_rev = sample.spec.pin(last)
    assert f"REVISION = {simpler_rev}" in (result.dest / "runtime/simpler/__init__.py").read_text()


def test_names_like_head_resolve_in_the_users_checkout(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    assert exporter.export("HEAD", tmp_path / "a").commit == sample.pypto_shas[-1]
    short = sample.pypto_shas[2][:10]
    assert exporter.export(short, tmp_path / "b").commit == sample.pypto_shas[2]


def test_override_moves_runtime_and_its_nested_submodule_follows(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    """The second-level bisect pins pypto at the culprit and moves runtime through simpler."""
    head = sample.pypto_shas[-1]
    old_simpler = sample.spec.nested_submodule_at - 1
    result = exporter.export(
        head, tmp_path / "old", overrides={RUNTIME_PATH: sample.simpler_shas[old_simpler][:12]}
    )
    assert result.submodules[RUNTIME_PATH] == sample.simpler_shas[old_simpler]
    assert NESTED_ISA not in result.submodules
    assert_exported(
        result.dest / RUNTIME_PATH, sample.mirrors["simpler"], result.submodules[RUNTIME_PATH]
    )
    assert_exported(result.dest, sample.mirrors["pypto"], head)

    isa_first = sample.isa_shas[0]
    nested = exporter.export(head, tmp_path / "isa", overrides={NESTED_ISA: isa_first})
    assert nested.submodules[NESTED_ISA] == isa_first
    assert nested.submodules[RUNTIME_PATH] == sample.gitlink(len(sample.pypto_shas) - 1)
    assert_exported(nested.dest / NESTED_ISA, sample.mirrors["isa"], isa_first)


def test_none_override_and_skip_leave_the_submodule_empty(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    head = sample.pypto_shas[-1]
    for name, kwargs in (
        ("none", {"overrides": {RUNTIME_PATH: None}}),
        ("skip", {"skip": [RUNTIME_PATH]}),
    ):
        result = exporter.export(head, tmp_path / name, **kwargs)
        assert set(result.submodules) == {LIBBACKTRACE_PATH}
        assert (result.dest / RUNTIME_PATH).is_dir()
        assert not any((result.dest / RUNTIME_PATH).iterdir())
        assert (result.dest / LIBBACKTRACE_PATH / "VERSION").is_file()

    # Overriding something inside a submodule that is left out is moot, not an error.
    result = exporter.export(
        head, tmp_path / "moot", skip=[RUNTIME_PATH], overrides={NESTED_ISA: sample.isa_shas[0]}
    )
    assert NESTED_ISA not in result.submodules


def test_overriding_a_submodule_the_commit_lacks_is_bad_input(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    dest = tmp_path / "pre-runtime"
    with pytest.raises(BadInput, match="has no submodule there"):
        exporter.export(
            sample.pypto_shas[0], dest, overrides={RUNTIME_PATH: sample.simpler_shas[1]}
        )
    assert not dest.exists()


def test_export_submodule_standalone_for_every_simpler_commit(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    for index, sha in enumerate(sample.simpler_shas):
        result = exporter.export_submodule(RUNTIME_PATH, sha, tmp_path / f"simpler-{index}")
        nested = assert_exported(result.dest, sample.mirrors["simpler"], sha)
        if index >= sample.spec.nested_submodule_at:
            assert result.submodules == {NESTED_ISA: nested[ISA_PATH]}
            assert_exported(result.dest / ISA_PATH, sample.mirrors["isa"], nested[ISA_PATH])
        else:
            assert result.submodules == {}


def test_export_submodule_nested_path_and_explicit_superproject_commit(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    isa = exporter.export_submodule(NESTED_ISA, sample.isa_shas[0], tmp_path / "isa")
    assert_exported(isa.dest, sample.mirrors["isa"], sample.isa_shas[0])

    old_libbacktrace = sample.libbacktrace_shas[0]
    at_old_url = exporter.export_submodule(
        LIBBACKTRACE_PATH, old_libbacktrace, tmp_path / "lbt", at=sample.pypto_shas[1]
    )
    assert_exported(at_old_url.dest, sample.mirrors["libbacktrace"], old_libbacktrace)

    with pytest.raises(BadInput, match="not a submodule"):
        exporter.export_submodule(
            RUNTIME_PATH, sample.simpler_shas[0], tmp_path / "x", at=sample.pypto_shas[0]
        )
    assert not (tmp_path / "x").exists()


def test_submodule_git_dir_sees_every_simpler_commit(
    sample: Sample, exporter: SourceExporter
) -> None:
    git_dir = exporter.submodule_git_dir(RUNTIME_PATH)
    listed = git(git_dir, "rev-list", "--reverse", sample.simpler_shas[-1]).split()
    assert listed == sample.simpler_shas
    assert not git_dir.is_relative_to(sample.pypto)


def test_users_checkout_is_byte_for_byte_unchanged(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    before = checkout_state(sample.pypto)
    for index, sha in enumerate(sample.pypto_shas):
        exporter.export(sha, tmp_path / "all" / str(index))
    for index, sha in enumerate(sample.simpler_shas):
        exporter.export_submodule(RUNTIME_PATH, sha, tmp_path / "simpler" / str(index))
    exporter.export(
        sample.pypto_shas[-1], tmp_path / "ov", overrides={RUNTIME_PATH: sample.simpler_shas[0]}
    )
    exporter.submodule_git_dir(RUNTIME_PATH)
    with pytest.raises(SourceUnavailable):
        exporter.export("0" * 40, tmp_path / "missing")
    assert checkout_state(sample.pypto) == before


def simpler_clone_with_a_commit(sample: Sample, dest: Path, filename: str, message: str) -> str:
    """Clone simpler to `dest` and commit a new file there: a commit no other store holds."""
    git(dest.parent, "clone", "-q", "--no-hardlinks", str(sample.mirrors["simpler"]), str(dest))
    (dest / filename).write_text(f"{message}\n")
    git(dest, "add", filename)
    git(dest, "commit", "-q", "-m", message)
    return git(dest, "rev-parse", "HEAD")


def make_checkout_with_unfetched_runtime_pin(sample: Sample, tmp_path: Path) -> tuple[Path, str]:
    """A copy of the user's checkout whose newest commit pins a simpler commit never fetched."""
    unfetched = simpler_clone_with_a_commit(
        sample, tmp_path / "elsewhere", "UNPUBLISHED", "wip: not pushed anywhere"
    )

    copy = tmp_path / "checkout"
    shutil.copytree(sample.pypto, copy, symlinks=True)
    git(copy, "update-index", "--cacheinfo", f"160000,{unfetched},{RUNTIME_PATH}")
    git(copy, "commit", "-q", "-m", "bump runtime to an unfetched commit")
    return copy, unfetched


def test_unfetched_submodule_pin_is_source_unavailable_and_leaves_no_dest(
    sample: Sample, tmp_path: Path
) -> None:
    checkout, unfetched = make_checkout_with_unfetched_runtime_pin(sample, tmp_path)
    exporter = SourceExporter(checkout, tmp_path / "cache")
    dest = tmp_path / "out"
    with pytest.raises(SourceUnavailable) as caught:
        exporter.export("HEAD", dest)
    message = str(caught.value)
    assert message.startswith("source unavailable: submodule runtime commit ")
    assert unfetched[:12] in message and ".git/modules/simpler" in message
    assert "fetch it there" in message
    # simpler is built at every test: no advice to leave it out
    assert "pass --simpler DIR with a clone that has it" in message
    assert "--omit-submodule" not in message
    assert caught.value.submodule == "runtime"
    assert not dest.exists()

    parent = exporter.export("HEAD~1", dest)
    assert parent.submodules[RUNTIME_PATH] == sample.gitlink(len(sample.pypto_shas) - 1)


def test_a_pin_a_shallow_submodule_lacks_says_the_clone_is_shallow(
    sample: Sample, tmp_path: Path
) -> None:
    """`git clone --shallow-submodules` cuts the runtime's history off: the message said to
    fetch the commit or find another clone, not that the clone is shallow (trial E)."""
    checkout, unfetched = make_checkout_with_unfetched_runtime_pin(sample, tmp_path)
    modules = checkout / ".git" / "modules" / "simpler"
    (modules / "shallow").write_text(sample.gitlink(len(sample.pypto_shas) - 1) + "\n")
    exporter = SourceExporter(checkout, tmp_path / "cache")

    with pytest.raises(SourceUnavailable) as caught:
        exporter.export("HEAD", tmp_path / "out")

    message = str(caught.value)
    assert unfetched[:12] in message
    assert "it is a shallow clone: `git -C runtime fetch --unshallow` completes it" in message


def test_every_unfetched_submodule_pin_is_named_in_one_error(
    sample: Sample, tmp_path: Path
) -> None:
    """A user fetching missing sources learns them all from one run, not one per rerun."""
    checkout, unfetched = make_checkout_with_unfetched_runtime_pin(sample, tmp_path)
    elsewhere = tmp_path / "lbt-elsewhere"
    git(tmp_path, "clone", "-q", str(sample.mirrors["libbacktrace"]), str(elsewhere))
    (elsewhere / "LOCAL").write_text("a local fix\n")
    git(elsewhere, "add", "LOCAL")
    git(elsewhere, "commit", "-q", "-m", "local fix")
    lbt = git(elsewhere, "rev-parse", "HEAD")
    git(checkout, "update-index", "--cacheinfo", f"160000,{lbt},{LIBBACKTRACE_PATH}")
    git(checkout, "commit", "-q", "-m", "pin a local libbacktrace fix")
    exporter = SourceExporter(checkout, tmp_path / "cache")

    with pytest.raises(SourceUnavailable) as caught:
        exporter.check("HEAD")
    message = str(caught.value)
    assert message.startswith("source unavailable: 2 submodule commits are not in the local ")
    assert f"{RUNTIME_PATH} commit {unfetched[:12]} (not in .git/modules/simpler)" in message
    assert f"{LIBBACKTRACE_PATH} commit {lbt[:12]}" in message
    assert "--submodule-source PATH=DIR" in message and "\n" not in message
    assert f"--simpler DIR for {RUNTIME_PATH}" in message

    # One given clone supplies the runtime's: only libbacktrace's is left, in the usual words.
    given = SourceExporter(
        checkout, tmp_path / "cache2", extra_repos={RUNTIME_PATH: [tmp_path / "elsewhere"]}
    )
    with pytest.raises(SourceUnavailable) as caught:
        given.check("HEAD")
    assert str(caught.value).startswith(
        f"source unavailable: submodule {LIBBACKTRACE_PATH} commit {lbt[:12]} is not in "
    )


@pytest.mark.parametrize(
    ("path", "text", "reads"),
    [
        (
            "python/bindings/CMakeLists.txt",
            "include_directories(${CMAKE_SOURCE_DIR}/runtime/src)",
            True,
        ),
        ("CMakeLists.txt", "add_subdirectory(runtime)\n", True),
        ("setup.py", 'HEADER = Path("runtime/include/abi.h")\n', True),
        ("src/core.cpp", '#include "runtime/include/abi.h"\n', True),
        ("src/core.cpp", '#include "../runtime/abi.h"\n', True),
        # pypto's own files that merely share the word
        (
            "CMakeLists.txt",
            "add_library(core src/runtime/scopes.cpp src/runtime_pass.cpp)\n",
            False,
        ),
        ("src/core.cpp", '#include "pypto/runtime/scopes.h"\n', False),
        ("docs/build.md", "the build reads ${CMAKE_SOURCE_DIR}/runtime/include\n", False),
    ],
)
def test_a_build_reads_the_runtime_when_its_build_files_or_includes_name_it(
    sample: Sample, tmp_path: Path, path: str, text: str, reads: bool
) -> None:
    _reads_after(sample, tmp_path, path, reads, lambda target: target.write_text(text))


@pytest.mark.parametrize(
    ("path", "target", "reads"),
    [
        ("pypto/_rt.py", "../runtime/simpler/__init__.py", True),
        ("include/rt", "../runtime", True),
        ("pypto/deep/abi.h", "../../runtime/include/abi.h", True),
        # a link that passes through the runtime's name but not into it, and an absolute one
        ("pypto/_own.py", "../runtime_helpers/own.py", False),
        ("pypto/_sys.py", "/opt/runtime/abi.py", False),
        ("pypto/_same.py", "other.py", False),
    ],
)
def test_a_build_reads_the_runtime_through_a_tracked_symlink_into_it(
    sample: Sample, tmp_path: Path, path: str, target: str, reads: bool
) -> None:
    """A bump that also adds a link into the runtime: its pypto wheel carries the runtime's file,
    so its code half (with the old simpler) was built with the new simpler's file and named
    pypto's code as the culprit (trial E)."""
    _reads_after(sample, tmp_path, path, reads, lambda link: link.symlink_to(target))


def _reads_after(sample: Sample, tmp_path: Path, path: str, reads: bool, make) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(sample.pypto, checkout, symlinks=True)
    target = checkout / path
    target.parent.mkdir(parents=True, exist_ok=True)
    make(target)
    git(checkout, "add", path)
    git(checkout, "commit", "-q", "-m", "build change")
    exporter = SourceExporter(checkout, tmp_path / "cache")

    assert exporter.reads_submodule("HEAD", RUNTIME_PATH) is reads
    assert exporter.reads_submodule("HEAD~1", RUNTIME_PATH) is False  # the sample's own build
    assert exporter.pinned("HEAD", RUNTIME_PATH) == sample.gitlink(len(sample.pypto_shas) - 1)
    assert exporter.pinned(sample.pypto_shas[0], RUNTIME_PATH) is None  # before the runtime


def test_a_separate_simpler_clone_supplies_commits_the_checkout_lacks(
    sample: Sample, tmp_path: Path
) -> None:
    checkout, unfetched = make_checkout_with_unfetched_runtime_pin(sample, tmp_path)
    clone = tmp_path / "elsewhere"  # the developer's own simpler clone, passed as --simpler
    before = checkout_state(clone)

    exporter = SourceExporter(checkout, tmp_path / "cache", {RUNTIME_PATH: [clone]})
    result = exporter.export("HEAD", tmp_path / "out")

    assert result.submodules[RUNTIME_PATH] == unfetched
    assert (tmp_path / "out" / RUNTIME_PATH / "UNPUBLISHED").is_file()
    assert checkout_state(clone) == before


def test_two_clones_given_for_the_runtime_each_supply_their_commits(
    sample: Sample, tmp_path: Path
) -> None:
    """Upstream (--simpler) and a fork (--submodule-source runtime=): pypto pins a commit of
    each, and the checkout has neither. Both clones are searched, the second level's git dir
    sees both histories, and a commit neither has names both clones."""
    checkout, upstream_only = make_checkout_with_unfetched_runtime_pin(sample, tmp_path)
    upstream = tmp_path / "elsewhere"
    fork = tmp_path / "fork"
    fork_only = simpler_clone_with_a_commit(sample, fork, "FORK", "fork: a fix upstream lacks")
    git(checkout, "update-index", "--cacheinfo", f"160000,{fork_only},{RUNTIME_PATH}")
    git(checkout, "commit", "-q", "-m", "bump runtime to the fork's commit")

    exporter = SourceExporter(checkout, tmp_path / "cache", {RUNTIME_PATH: [upstream, fork]})
    on_fork = exporter.export("HEAD", tmp_path / "fork-out")
    on_upstream = exporter.export("HEAD~1", tmp_path / "upstream-out")

    assert on_fork.submodules[RUNTIME_PATH] == fork_only
    assert (tmp_path / "fork-out" / RUNTIME_PATH / "FORK").is_file()
    assert on_upstream.submodules[RUNTIME_PATH] == upstream_only
    assert (tmp_path / "upstream-out" / RUNTIME_PATH / "UNPUBLISHED").is_file()
    mirror = History(exporter.submodule_git_dir(RUNTIME_PATH))
    assert mirror.has_commit(fork_only) and mirror.has_commit(upstream_only)

    lost = SourceExporter(checkout, tmp_path / "cache2", {RUNTIME_PATH: [sample.lib, fork]})
    with pytest.raises(SourceUnavailable) as caught:
        lost.export("HEAD~1", tmp_path / "lost-out")
    assert f"nor in {sample.lib} or {fork}, the clones given for it" in str(caught.value)


def test_a_commit_the_given_clone_lacks_too_names_that_clone(
    sample: Sample, tmp_path: Path
) -> None:
    checkout, unfetched = make_checkout_with_unfetched_runtime_pin(sample, tmp_path)
    wrong = sample.mirrors["isa"]  # --simpler pointing at another repository

    exporter = SourceExporter(checkout, tmp_path / "cache", {RUNTIME_PATH: [wrong]})
    with pytest.raises(SourceUnavailable) as caught:
        exporter.export("HEAD", tmp_path / "out")

    message = str(caught.value)
    assert f"commit {unfetched[:12]} is neither in the local checkout" in message
    assert f"nor in {wrong}, the clone given for it" in message
    assert caught.value.submodule == "runtime"


def checkout_without_isa_objects(sample: Sample, tmp_path: Path) -> Path:
    """A copy of the checkout that lost the nested isa submodule's objects."""
    copy = tmp_path / "checkout"
    shutil.copytree(sample.pypto, copy, symlinks=True)
    shutil.rmtree(copy / ".git" / "modules" / "simpler" / "modules")
    shutil.rmtree(copy / NESTED_ISA, ignore_errors=True)
    return copy


def test_a_nested_submodule_is_named_omitted_and_sourced_by_its_path_from_the_top(
    sample: Sample, tmp_path: Path
) -> None:
    checkout = checkout_without_isa_objects(sample, tmp_path)
    simpler = sample.simpler_shas[-1]
    exporter = SourceExporter(checkout, tmp_path / "cache")

    # The standalone simpler export names the nested path as the pypto export does ...
    for export in (
        lambda: exporter.export("HEAD", tmp_path / "all"),
        lambda: exporter.export_submodule(RUNTIME_PATH, simpler, tmp_path / "alone"),
    ):
        with pytest.raises(SourceUnavailable) as caught:
            export()
        assert caught.value.submodule == NESTED_ISA
        assert f"--omit-submodule {NESTED_ISA} " in str(caught.value)

    # ... so the path the message names omits it from both ...
    alone = exporter.export_submodule(
        RUNTIME_PATH, simpler, tmp_path / "omitted", skip=[NESTED_ISA]
    )
    assert alone.submodules == {}
    assert list((alone.dest / ISA_PATH).iterdir()) == []
    exporter.check("HEAD", skip=[NESTED_ISA])

    # ... also when a clone given for it lacks the commit too (the real libbacktrace pin) ...
    wrong = SourceExporter(checkout, tmp_path / "cache3", {NESTED_ISA: [sample.lib]})
    with pytest.raises(SourceUnavailable) as caught:
        wrong.export("HEAD", tmp_path / "wrong")
    assert f"nor in {sample.lib}, the clone given for it" in str(caught.value)
    assert f"--omit-submodule {NESTED_ISA} if the build" in str(caught.value)

    # ... and another clone given for that path supplies its objects to both.
    sourced = SourceExporter(checkout, tmp_path / "cache2", {NESTED_ISA: [sample.mirrors["isa"]]})
    result = sourced.export_submodule(RUNTIME_PATH, simpler, tmp_path / "sourced")
    assert set(result.submodules) == {NESTED_ISA}
    assert_exported(result.dest / ISA_PATH, sample.mirrors["isa"], result.submodules[NESTED_ISA])
    assert sourced.export("HEAD", tmp_path / "sourced-all").submodules[NESTED_ISA]


def test_a_shallow_submodule_pin_exports_and_its_cut_history_says_so(
    sample: Sample, tmp_path: Path
) -> None:
    # `git submodule update --depth 1` after a bump: the old pin's history, the new pin alone.
    copy = tmp_path / "checkout"
    shutil.copytree(sample.pypto, copy, symlinks=True)
    module = copy / ".git" / "modules" / "simpler"
    keep = tmp_path / "keep"
    keep.mkdir()
    shutil.move(module / "modules", keep / "modules")
    shutil.copy(module / "config", keep / "config")
    shutil.rmtree(module)
    git(tmp_path, "init", "-q", "--bare", str(module))
    bump = max(sample.spec.bump_indices)  # the last one: HEAD pins its new pointer
    old, new = sample.gitlink(bump - 1), sample.gitlink(bump)
    upstream = f"file://{sample.mirrors['simpler']}"
    git(module, "fetch", "-q", upstream, f"{old}:refs/heads/old")
    git(module, "fetch", "-q", "--depth", "1", upstream, f"{new}:refs/heads/new")
    shutil.copy(keep / "config", module / "config")
    shutil.move(keep / "modules", module / "modules")
    assert old != new and (module / "shallow").is_file()

    exporter = SourceExporter(copy, tmp_path / "cache")
    result = exporter.export("HEAD", tmp_path / "out")
    assert result.submodules[RUNTIME_PATH] == new
    with pytest.raises(SourceUnavailable, match=r"history between .* is cut off.*--unshallow"):
        pointer_states(exporter.submodule_git_dir(RUNTIME_PATH), old, new)

    # Another clone with the whole history completes it: the same move reads as a forward one.
    whole = SourceExporter(copy, tmp_path / "cache2", {RUNTIME_PATH: [sample.mirrors["simpler"]]})
    direction, states = pointer_states(whole.submodule_git_dir(RUNTIME_PATH), old, new)
    assert direction == "forward" and states[0] == old and states[-1] == new and len(states) > 2


def test_objects_kept_under_another_module_name_are_still_found(
    sample: Sample, tmp_path: Path
) -> None:
    # .gitmodules names the submodule "simpler", but the checkout keeps it under an older name.
    copy = tmp_path / "checkout"
    shutil.copytree(sample.pypto, copy, symlinks=True)
    (copy / ".git" / "modules" / "simpler").rename(copy / ".git" / "modules" / "runtime-old")
    shutil.rmtree(copy / RUNTIME_PATH)

    result = SourceExporter(copy, tmp_path / "cache").export("HEAD", tmp_path / "out")

    assert result.submodules[RUNTIME_PATH] == sample.gitlink(len(sample.pypto_shas) - 1)


def test_missing_superproject_commit_and_bad_names(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    with pytest.raises(SourceUnavailable, match=r"commit 0123456789ab is not in the local"):
        exporter.export("0123456789ab" * 3 + "0123", tmp_path / "a")
    with pytest.raises(BadInput, match="unknown revision"):
        exporter.export("no-such-branch", tmp_path / "b")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_non_empty_destination_is_refused_and_kept(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine\n")
    with pytest.raises(BadInput, match="not empty"):
        exporter.export(sample.pypto_shas[-1], dest)
    assert (dest / "keep.txt").read_text() == "mine\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert exporter.export(sample.pypto_shas[0], empty).dest == empty


def test_paths_that_are_not_a_checkout_root_are_bad_input(sample: Sample, tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(BadInput, match="not a git repository"):
        SourceExporter(plain, tmp_path / "cache")
    with pytest.raises(BadInput, match="does not exist"):
        SourceExporter(tmp_path / "nowhere", tmp_path / "cache")
    with pytest.raises(BadInput, match="not the top of a git checkout"):
        SourceExporter(sample.pypto / "pypto", tmp_path / "cache")
    with pytest.raises(BadInput, match="is the git directory of a checkout, not the checkout"):
        SourceExporter(sample.pypto / ".git", tmp_path / "cache")


def test_two_runs_share_one_cache(sample: Sample, tmp_path: Path) -> None:
    cache = tmp_path / "shared-cache"
    exporters = [SourceExporter(sample.pypto, cache) for _ in range(2)]
    jobs = [
        (exporters[i % 2], sha, tmp_path / f"run{i % 2}" / str(i))
        for i, sha in enumerate(sample.pypto_shas * 2)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results: list[ExportResult] = list(pool.map(lambda job: job[0].export(*job[1:]), jobs))
    by_commit: dict[str, set[tuple[tuple[str, str], ...]]] = {}
    for result in results:
        by_commit.setdefault(result.commit, set()).add(tuple(sorted(result.submodules.items())))
    assert all(len(variants) == 1 for variants in by_commit.values())
    assert len(list((cache / "mirrors").iterdir())) == 2  # one superproject dir and its lock


def test_submodule_found_through_a_local_url_and_an_old_style_git_dir(tmp_path: Path) -> None:
    """Objects may live only behind a local .gitmodules URL or a `<path>/.git` directory."""
    vendor = tmp_path / "vendor"
    git(tmp_path, "init", "-q", str(vendor))
    (vendor / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    (vendor / "tool.sh").chmod(0o755)
    os.symlink("tool.sh", vendor / "alias.sh")
    git(vendor, "add", "-A")
    git(vendor, "commit", "-q", "-m", "vendor tool")
    vendor_sha = git(vendor, "rev-parse", "HEAD")

    legacy = tmp_path / "legacy"
    git(tmp_path, "init", "-q", str(legacy))
    (legacy / "README").write_text("legacy\n")
    git(legacy, "add", "-A")
    git(legacy, "commit", "-q", "-m", "legacy")
    legacy_sha = git(legacy, "rev-parse", "HEAD")

    top = tmp_path / "top"
    git(tmp_path, "init", "-q", str(top))
    (top / ".gitmodules").write_text(
        '[submodule "vendor"]\n\tpath = ext/vendor\n\turl = ../vendor\n'
        '[submodule "legacy"]\n\tpath = legacy\n\turl = https://git.invalid/legacy.git\n'
    )
    git(top, "update-index", "--add", "--cacheinfo", f"160000,{vendor_sha},ext/vendor")
    git(top, "update-index", "--add", "--cacheinfo", f"160000,{legacy_sha},legacy")
    git(top, "add", ".gitmodules")
    git(top, "commit", "-q", "-m", "top")
    shutil.move(str(legacy), str(top / "legacy"))  # a work tree with its own .git directory

    before = checkout_state(top)
    result = SourceExporter(top, tmp_path / "cache").export("HEAD", tmp_path / "out")
    assert result.submodules == {"ext/vendor": vendor_sha, "legacy": legacy_sha}
    assert_exported(result.dest / "ext/vendor", vendor, vendor_sha)
    assert os.access(result.dest / "ext/vendor/tool.sh", os.X_OK)
    assert os.readlink(result.dest / "ext/vendor/alias.sh") == "tool.sh"
    assert (result.dest / "legacy/README").read_text() == "legacy\n"
    assert checkout_state(top) == before


def test_warm_export_time_of_a_few_thousand_files(tmp_path: Path) -> None:
    big = tmp_path / "big"
    git(tmp_path, "init", "-q", str(big))
    for package in range(40):
        folder = big / "src" / f"pkg{package:02d}"
        folder.mkdir(parents=True)
        for module in range(75):
            (folder / f"m{module:02d}.cc").write_text(
                f"int f{package}_{module}() {{ return 0; }}\n"
            )
    git(big, "add", "-A")
    git(big, "commit", "-q", "-m", "3000 files")
    exporter = SourceExporter(big, tmp_path / "cache")
    cold = exporter.export("HEAD", tmp_path / "cold")
    warm = exporter.export("HEAD", tmp_path / "warm")
    assert len(list((warm.dest / "src").rglob("*.cc"))) == 3000
    report = f"export of 3000 files to disk: cold {cold.seconds:.3f}s, warm {warm.seconds:.3f}s"
    memory = Path("/dev/shm")
    if memory.is_dir() and os.access(memory, os.W_OK):
        # Separates the tool's own cost from the disk's: file creation dominates on slow disks.
        with tempfile.TemporaryDirectory(dir=memory) as scratch:
            in_memory = exporter.export("HEAD", Path(scratch) / "out")
        report += f", to tmpfs {in_memory.seconds:.3f}s"
    print(f"\n{report}")


def test_warm_export_time_of_the_sample(sample_factory: SampleFactory, tmp_path: Path) -> None:
    sample = sample_factory(SampleSpec())
    exporter = SourceExporter(sample.pypto, tmp_path / "cache")
    exporter.export(sample.pypto_shas[-1], tmp_path / "cold")
    warm = exporter.export(sample.pypto_shas[-1], tmp_path / "warm")
    assert len(warm.submodules) == 3
    print(f"\nwarm export of the sample head with 3 submodules: {warm.seconds:.3f}s")


def test_a_clone_given_for_the_runtime_that_holds_neither_pin_is_warned_about(
    sample: Sample,
) -> None:
    history = History(sample.pypto)
    ends = (sample.pypto_shas[0], sample.pypto_shas[-1])
    assert _unrelated_clones(history, ends, {RUNTIME_PATH: [sample.mirrors["simpler"]]}) == []
    warned = _unrelated_clones(history, ends, {RUNTIME_PATH: [sample.lib]})
    assert len(warned) == 1 and warned[0].startswith(f"{sample.lib} holds neither endpoint's")
    for path in ("nothere", "foo/bar"):
        nowhere = _unrelated_clones(history, ends, {path: [sample.mirrors["simpler"]]})
        assert nowhere == [
            f"{sample.mirrors['simpler']} is given for the submodule at {path}, but neither "
            "endpoint has one there; it is used only if a commit in between has one"
        ]
    # One in a subfolder is checked as the runtime is; a submodule's own submodule is not.
    wrong = _unrelated_clones(history, ends, {LIBBACKTRACE_PATH: [sample.lib]})
    assert len(wrong) == 1 and wrong[0].startswith(f"{sample.lib} holds neither endpoint's")
    assert _unrelated_clones(history, ends, {NESTED_ISA: [sample.lib]}) == []
    # Beside a clone that holds a pin, another (a fork's) may hold none.
    fork = {RUNTIME_PATH: [sample.lib, sample.mirrors["simpler"]]}
    assert _unrelated_clones(history, ends, fork) == []


def test_check_says_which_omitted_paths_the_commit_has(
    sample: Sample, exporter: SourceExporter
) -> None:
    seen: set[str] = set()
    skip = [LIBBACKTRACE_PATH, NESTED_ISA, "3rdparty/nosuch"]
    exporter.check("HEAD", skip=skip, omitted=seen)
    assert seen == {LIBBACKTRACE_PATH, NESTED_ISA}


def test_skip_takes_pypto_revisions_and_simpler_commits_and_names_what_it_cannot_find(
    sample: Sample, exporter: SourceExporter, tmp_path: Path
) -> None:
    history = History(sample.pypto)
    simpler = sample.simpler_shas[2]
    settings = Settings(skip=["HEAD~1", simpler[:10]])

    assert _skipped(settings, history, exporter) == {sample.pypto_shas[-2], simpler}
    skip = _skipped(Settings(skip=["HEAD~1", "HEAD~5"]), history, exporter)
    assert _skips_outside(
        Settings(skip=["HEAD~1", "HEAD~5"]), history, skip, sample.pypto_shas[-4:]
    ) == [
        f"--skip HEAD~5: pypto {sample.pypto_shas[-6][:12]} is not on the range's first-parent "
        "chain; it skips nothing"
    ]

    with pytest.raises(BadInput) as raised:
        _skipped(Settings(skip=["no-such-rev"]), history, exporter)
    assert str(raised.value) == (
        "--skip no-such-rev: no such commit in pypto or in its runtime submodule"
    )
    config = tmp_path / "skip.toml"
    config.write_text('skip = ["no-such-rev"]\n')
    with pytest.raises(BadInput) as raised:
        _skipped(load_settings({}, config), history, exporter)
    assert str(raised.value).startswith(f"{config}: skip no-such-rev: no such commit")
    with pytest.raises(BadInput, match="is an end of the range; move --good or --bad"):
        _skipped(
            Settings(skip=["HEAD"]),
            history,
            exporter,
            (sample.pypto_shas[0], sample.pypto_shas[-1]),
        )


def test_a_commit_whose_gitmodules_lost_the_runtime_still_exports_it_by_its_gitlink(
    sample: Sample, tmp_path: Path
) -> None:
    """A commit dropped .gitmodules but kept the gitlinks (a later one restores it): the build
    of that commit must still find simpler under the name the rest of the history gives it."""
    copy = tmp_path / "checkout"
    shutil.copytree(sample.pypto, copy, symlinks=True)
    git(copy, "rm", "-q", "--cached", ".gitmodules")
    git(copy, "commit", "-q", "-m", "drop .gitmodules by mistake")
    broken = git(copy, "rev-parse", "HEAD")
    pinned = sample.gitlink(len(sample.pypto_shas) - 1)
    exporter = SourceExporter(copy, tmp_path / "cache")

    whole = exporter.export(broken, tmp_path / "whole")
    alone = exporter.export_submodule(
        RUNTIME_PATH, sample.simpler_shas[2], tmp_path / "alone", at=broken
    )

    assert whole.submodules[RUNTIME_PATH] == pinned
    assert_exported(whole.dest / RUNTIME_PATH, sample.mirrors["simpler"], pinned)
    assert_exported(alone.dest, sample.mirrors["simpler"], sample.simpler_shas[2])
    with pytest.raises(BadInput, match=r"no gitlink or \.gitmodules entry"):
        exporter.export_submodule("docs", sample.simpler_shas[2], tmp_path / "x", at=broken)


def test_a_partial_clone_lacking_a_commits_files_is_bad_input_not_a_machine_fault(
    sample: Sample, tmp_path: Path
) -> None:
    origin = tmp_path / "origin.git"
    git(tmp_path, "clone", "-q", "--bare", str(sample.mirrors["pypto"]), str(origin))
    git(origin, "config", "uploadpack.allowFilter", "true")
    partial = tmp_path / "partial"
    git(tmp_path, "clone", "-q", "--filter=blob:none", f"file://{origin}", str(partial))
    exporter = SourceExporter(partial, tmp_path / "cache")

    with pytest.raises(BadInput, match=r"is a partial clone \(git clone --filter\) and lacks"):
        exporter.export(sample.pypto_shas[1], tmp_path / "out", skip=[RUNTIME_PATH])
