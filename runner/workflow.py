"""Wires the real pieces together for the CLI's `run`: settings, history, exporter, wheel cache,
Docker tester, ledger, session, reports.

`cli.py` only parses and prints; the session decides; this module builds the objects it needs.
`replay.py` rebuilds a session from its ledger (`status`, `report`) and `reproduce.py` runs one
attempt again, both with the wiring here. What a report shows beyond the ledger is gathered in
`findings.py`.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from runner import __version__, plots
from runner.attempts import DockerTester, RunSettings
from runner.confidence import DEFAULT_CONFIDENCE
from runner.config import DEFAULT_BUILD_COMMAND, Settings
from runner.containers import Mount
from runner.errors import (
    SOURCE_UNAVAILABLE,
    USER_SKIP,
    BadInput,
    BisectError,
    EndpointsDoNotReproduce,
    LedgerError,
    SourceUnavailable,
)
from runner.execute import reclaim, remove_stale_containers
from runner.executor import Executor, LocalExecutor
from runner.files import write_text_atomic
from runner.findings import gather_facts
from runner.fingerprint import Collector
from runner.fingerprint import changes as fingerprint_changes
from runner.fingerprint import describe as describe_change
from runner.history import History, pointer_states
from runner.inputs import SNAPSHOTS, snapshot
from runner.ledger import (
    Attempt,
    Ledger,
    LedgerDocument,
    Level,
    SessionInputs,
    session_copy,
    session_folder,
)
from runner.prepare import Prepared, make_provisioner, prepare
from runner.report import REPORT_FILES, RETHRESHOLD_DIR, write_reports
from runner.search import Verdict
from runner.session import (
    EndpointFailure,
    Events,
    LevelResult,
    Lookup,
    More,
    Outcome,
    Request,
    Session,
    Tester,
)
from runner.sources import SourceExporter
from runner.toolchains import Toolchains
from runner.verdict import Tolerance
from runner.wheels import BuildSettings, WheelCache
from runner.wording import counted

LEDGER_NAME = "ledger.json"
SETTINGS_NAME = "settings.json"


@dataclass
class RunResult:
    outcome: Outcome
    report_json: Path
    report_md: Path
    report: dict


def ledger_path(workdir: Path) -> Path:
    return workdir / LEDGER_NAME


def build_settings(
    settings: Settings, base_image_id: str, content: dict[str, str] | None = None
) -> BuildSettings:
    environment = dict(settings.build_env)
    mounts: list[Mount] = []
    if settings.pto_isa_root is not None:
        root = str(settings.pto_isa_root.expanduser().resolve())
        environment["PTO_ISA_ROOT"] = root
        mounts.append(Mount(root, root))
    if settings.ascend_home_path:
        environment["ASCEND_HOME_PATH"] = settings.ascend_home_path
    command = settings.build_command
    if command == DEFAULT_BUILD_COMMAND and settings.python != "python3":
        command = f"{settings.python} {command.removeprefix('python3 ')}"  # --python builds too
    return BuildSettings(
        base_image=settings.base_image,
        base_image_id=base_image_id,
        command=command,
        environment=environment,
        mounts=tuple(mounts),
        network=settings.build_network,
        omitted=tuple(settings.omit_submodules),
        content=dict(content or {}),
        cpus=settings.cpus,
        memory=settings.memory,
        timeout=settings.build_timeout,
    )


def run_settings(prepared: Prepared) -> RunSettings:
    settings = prepared.settings
    environment = dict(settings.run_env)
    if settings.ascend_home_path:
        environment["ASCEND_HOME_PATH"] = settings.ascend_home_path
    return RunSettings(
        # Runs read the session's snapshot, never the live checkout (see inputs.py).
        lib_dir=prepared.workdir / SNAPSHOTS / prepared.lib_digest[:16],
        script=prepared.script,
        platform=settings.platform,
        device=settings.device,
        passthrough=prepared.passthrough,
        extra_args=list(settings.extra_args),
        python=settings.python,
        environment=environment,
        ptoas_root=settings.ptoas_root.expanduser().resolve() if settings.ptoas_root else None,
        pto_isa_root=settings.pto_isa_root.expanduser().resolve()
        if settings.pto_isa_root
        else None,
        cpus=settings.cpus,
        memory=settings.memory,
        timeout=settings.timeout,
        patterns=prepared.patterns,
    )


def docker_tester(
    prepared: Prepared,
    ledger: Ledger,
    workdir: Path,
    *,
    phase: Callable[[str], None] | None = None,
    echo: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
    note: Callable[[str], None] | None = None,
    wheels: Path | None = None,
    ahead: Callable[[int], None] | None = None,
) -> DockerTester:
    """`echo` streams logs (--verbose); `warn` and `note` say what the user should see anyway
    (a card leaving the pool; build tools being downloaded, a builder image being built);
    `wheels`: a wheel cache of its own instead of the shared one."""
    settings = prepared.settings
    cache = WheelCache(wheels or prepared.cache_root / "wheels", lease=True)
    cache.sweep_leftovers()
    return DockerTester(
        make_executor(prepared, cache, echo, warn),
        ledger,
        prepared.exporter,
        cache,
        build_settings(settings, prepared.base_image_id, prepared.content),
        run_settings(prepared),
        workdir=workdir,
        ccache_dir=prepared.cache_root / "ccache",
        submodule_path=settings.submodule_path,
        toolchains=Toolchains(
            prepared.exporter,
            make_provisioner(
                settings,
                prepared.client,
                prepared.base_image_id,
                prepared.cache_root,
                echo=note or echo,
            ),
            submodule_path=settings.submodule_path,
            phase=phase,
        ),
        omit=settings.omit_submodules,
        infra_retries=settings.infra_retries,
        phase=phase,
        echo=echo,
        warn=warn,
        fingerprint=Collector(
            prepared.client, settings.base_image, settings.device, prepared.base_image_id
        ),
        prefetch=settings.prefetch,
        skip=prepared.skip,
        ahead=ahead,
    )


def make_executor(
    prepared: Prepared,
    cache: WheelCache,
    echo: Callable[[str], None] | None,
    warn: Callable[[str], None] | None = None,
) -> Executor:
    """The executor `--executor` names; Ray is imported only when asked for."""
    settings = prepared.settings
    if settings.executor == "ray":
        if importlib.util.find_spec("ray") is None:
            raise BadInput(
                "--executor ray needs Ray: pip install 'bisect-precision-docker[ray]' "
                "(or use --executor local)"
            )
        from runner.ray_executor import RayExecutor

        return RayExecutor.connect(prepared, cache, echo=echo, warn=warn)
    return LocalExecutor(
        prepared.client,
        cache,
        prepared.slots,
        build_jobs=settings.build_jobs,
        echo=echo,
        warn=warn,
    )


class _Watched:
    """Passes tests on to the Docker tester and warns the moment an attempt's environment
    fingerprint differs from the attempt before it (a retagged base image, a new driver)."""

    def __init__(self, tester: DockerTester, ledger: Ledger, events: Events | None) -> None:
        self.tester = tester
        self.ledger = ledger
        self.events = events
        self.prefetch = tester.prefetch
        self.cached = tester.cached
        self.reads_runtime = tester.reads_runtime

    @property
    def parallel(self) -> int:
        return self.tester.parallel

    def test(self, level: Level, pypto: str, simpler: str | None) -> Attempt:
        attempt = self.tester.test(level, pypto, simpler)
        self._warn(attempt)
        return attempt

    adds_requests = True

    def test_round(
        self,
        requests: Sequence[Request],
        done: Callable[[Attempt], None] | None = None,
        more: More | None = None,
    ) -> list[Attempt]:
        def watched(attempt: Attempt) -> None:
            self._warn(attempt)
            if done is not None:
                done(attempt)

        return self.tester.test_round(requests, watched, more)

    def _warn(self, attempt: Attempt) -> None:
        if self.events is not None:
            for change in fingerprint_changes(self.ledger.document.attempts):
                if change.after == attempt.run_id:
                    self.events.warn(describe_change(change))


def make_session(
    history: History,
    exporter: SourceExporter,
    tester: Tester,
    lookup: Lookup,
    inputs: SessionInputs,
    settings: Settings | None,
    *,
    events: Events | None = None,
) -> Session:
    """A session over `inputs`, whose simpler questions go to the exporter's submodule mirror."""
    path = inputs.submodule_path
    simpler = functools.cache(lambda: History(exporter.submodule_git_dir(path)))

    def merge_base(old: str, new: str) -> str | None:
        try:
            return simpler().merge_base(old, new)
        except SourceUnavailable:
            return None

    def merged_line(merge: str, via: str) -> list[str]:
        try:
            return simpler().merged_line(merge, via)
        except SourceUnavailable:
            return []

    return Session(
        history,
        tester,
        lookup,
        good=inputs.good,
        bad=inputs.bad,
        submodule_path=path,
        verify=settings.verify if settings is not None else True,
        simpler_states=lambda old, new: pointer_states(exporter.submodule_git_dir(path), old, new),
        merge_base=merge_base,
        simpler_subject=lambda sha: simpler().subject(sha),
        merged_line=merged_line,
        reads_runtime=lambda commit: exporter.reads_submodule(commit, path),
        events=events,
        confidence=settings.confidence if settings is not None else DEFAULT_CONFIDENCE,
        repeat=settings.repeat if settings is not None else None,
        policy=settings.policy if settings is not None else "majority",
        tolerance=settings.tolerance() if settings is not None else None,
        drift_check=settings.drift_check if settings is not None else True,
    )


def _save_settings(workdir: Path, settings: Settings) -> None:
    """The full settings beside the ledger, so `reproduce` can rebuild the exact environment."""
    write_text_atomic(workdir / SETTINGS_NAME, settings.model_dump_json(indent=2) + "\n")


# What a session keeps in the workdir beside its ledger and settings, and `--new-session` moves
# to the earlier session's folder.
_SESSION_FILES = (*REPORT_FILES, RETHRESHOLD_DIR, "reproductions")


def _abandon(ledger: Ledger, workdir: Path) -> None:
    """An invocation stopped on bad input before its first test: a `--new-session` that the
    input stopped leaves the earlier session in place, its settings and reports too."""
    backup = ledger.abandon_invocation()
    if backup is None:
        return
    saved = session_copy(backup, SETTINGS_NAME)
    if saved.exists():
        os.replace(saved, workdir / SETTINGS_NAME)
    else:
        (workdir / SETTINGS_NAME).unlink(missing_ok=True)
    folder = session_folder(workdir, backup)
    for name in _SESSION_FILES:
        if (folder / name).exists():
            os.replace(folder / name, workdir / name)
    with contextlib.suppress(OSError):
        folder.rmdir()
        folder.parent.rmdir()  # only when no earlier session keeps a folder there


def _keep_earlier_session(workdir: Path, backup: Path) -> None:
    """The earlier session's settings.json goes beside its backup ledger, for `--session`; its
    reports and reproductions go to that session's folder, where `report --session` and
    `reproduce --session` write. The workdir's reports, which CI and people read, never
    describe a session its ledger no longer holds."""
    current = workdir / SETTINGS_NAME
    if current.exists():
        shutil.copy2(current, session_copy(backup, SETTINGS_NAME))
    folder = session_folder(workdir, backup)
    for name in _SESSION_FILES:
        if (workdir / name).exists():
            folder.mkdir(parents=True, exist_ok=True)
            os.replace(workdir / name, folder / name)


def load_saved_settings(workdir: Path, path: Path | None = None) -> Settings:
    path = workdir / SETTINGS_NAME if path is None else path
    try:
        return Settings.model_validate_json(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{workdir} holds no bisect session ({SETTINGS_NAME} is missing)") from None
    except ValueError as exc:
        raise LedgerError(f"{path} is not a valid settings file: {exc}") from exc


def endpoint_error(failure: EndpointFailure) -> EndpointsDoNotReproduce:
    attempt = failure.attempt
    sha = attempt.pypto_sha[:12]
    why = f"{attempt.verdict.value}: {attempt.reason}" if attempt.reason else attempt.verdict.value
    if failure.which == "good" and attempt.verdict is Verdict.BAD:
        text = (
            f"the known-good commit {sha} fails too ({why}): either it is not good here (pick "
            "an older --good) or the environment is at fault (check the base image, devices "
            "and goldens)"
        )
    elif attempt.reason.startswith(SOURCE_UNAVAILABLE):
        text = f"the known-{failure.which} commit {sha} cannot be exported: {attempt.reason}"
    elif attempt.reason.startswith("build failed") and (module := _missing_module(attempt.reason)):
        text = (
            f"the known-{failure.which} commit {sha} could not be built ({why}): its builder "
            f"image lacks the Python module {module}, which the build imports (a build tool's "
            "dependency, or one the project's build uses without declaring it); add the package "
            f'that provides it: --build-pin \'{{"requirements": ["{module.split(".")[0]}"]}}\' '
            "--new-session"
        )
    elif (module := _missing_module(attempt.reason)) is not None:
        text = (
            f"the known-{failure.which} commit {sha} could not be tested ({why}): the base image "
            f"lacks the Python module {module}, which the example or a wheel imports; add it to "
            "the base image (runs have no network to install it)"
        )
    elif attempt.simpler_sha is None and "No module named 'simpler" in attempt.reason:
        text = (
            f"the known-{failure.which} commit {sha} could not be tested ({why}): it has no "
            "runtime submodule, so no simpler was installed for the example; pick a "
            f"--{failure.which} that has one"
        )
        if failure.which == "good":
            text += ", or pass --no-verify to take it as good untested"
    elif failure.which == "good":
        text = (
            f"the known-good commit {sha} could not be tested ({why}); {_unblock(attempt)}, "
            "pick another --good, or pass --no-verify to take it as good untested"
        )
    elif attempt.verdict is Verdict.GOOD:
        text = f"the known-bad commit {sha} passes: there is no regression to bisect in this range"
    else:
        text = (
            f"the known-bad commit {sha} could not be tested ({why}); {_unblock(attempt)}, or "
            "pick another --bad"
        )
    log = f" (log: {attempt.log_path})" if attempt.log_path else ""
    return EndpointsDoNotReproduce(text + log)


_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def _missing_module(reason: str) -> str | None:
    """A module a run could not import that neither wheel brings (numpy, say): the base
    image's to provide, whatever commit is tested."""
    found = _NO_MODULE.search(reason)
    if found is None or found.group(1).split(".")[0] in ("pypto", "simpler"):
        return None
    return found.group(1)


def _unblock(attempt: Attempt) -> str:
    """What lets an endpoint that could not be tested run after all."""
    if attempt.reason.startswith("build failed"):
        # New build tools are new settings: the session they judge is a new one.
        return (
            "fix its build (the log says what failed; other build tools: --build-pin, a "
            "variable its build reads: --build-env, each with --new-session)"
        )
    return "fix what stopped it (see the log)"


def run_bisect(
    settings: Settings,
    *,
    new_session: bool = False,
    events: Events | None = None,
    phase: Callable[[str], None] | None = None,
    echo: Callable[[str], None] | None = None,
    ahead: Callable[[int], None] | None = None,
) -> RunResult:
    """`ahead` hears how many guessed builds are under way whenever that changes."""
    started = time.monotonic()
    prepared = prepare(settings)
    plots.warm()
    remove_stale_containers(prepared.client)
    reclaim(
        prepared.client,
        prepared.base_image_id,
        prepared.workdir / "runs",
        prepared.workdir / "reclaim.log",
    )
    for warning in [*prepared.warnings, *prepared.passthrough.warnings]:
        if events is not None:
            events.warn(warning)
    workdir = prepared.workdir
    with Ledger.open(
        ledger_path(workdir), prepared.inputs, tool_version=__version__, new_session=new_session
    ) as ledger:
        ledger.document.check_range([prepared.good, *prepared.commits], ledger_path(workdir))
        if ledger.backup is not None:
            _keep_earlier_session(workdir, ledger.backup)
        _save_settings(workdir, settings)
        snapshot(prepared.lib, prepared.lib_digest, workdir, prepared.lib_exclude)
        ledger.start_invocation(started)
        recorded = len(ledger.document.attempts)
        warn = events.warn if events is not None else None
        try:
            tester = docker_tester(
                prepared,
                ledger,
                workdir,
                phase=phase,
                echo=echo,
                warn=warn,
                note=events.note if events is not None else None,
                ahead=ahead,
            )
        except BisectError as exc:
            if exc.exit_code == 2:
                _abandon(ledger, workdir)
            raise
        session = make_session(
            prepared.history,
            prepared.exporter,
            _Watched(tester, ledger, events),
            lambda pypto, simpler: ledger.document.find_all(pypto, simpler),
            prepared.inputs,
            settings,
            events=events,
        )
        try:
            tester.preflight(
                [prepared.good, *prepared.commits],
                # Each end's own pin: `gitlinks` reads a whole first-parent chain, and given only
                # the two ends it would carry the good end's pin over a move in between.
                {
                    end: prepared.history.gitlink(end, settings.submodule_path)
                    for end in (prepared.good, prepared.bad)
                },
                {"good": prepared.good, "bad": prepared.bad} if settings.verify else {},
            )
            # Missing sources are the checkout's state, not the commit's: once they are there,
            # their pairs are tested like any other.
            again = tester.exportable_again(ledger.document.skips(SOURCE_UNAVAILABLE))
            ledger.supersede(again)
            if again and events is not None:
                events.note(
                    f"{len(again)} skips for sources that were missing are tested again: the "
                    "checkout or the clones given now hold them"
                )
            # A commit taken out with --skip before and not now is tested like any other.
            unskipped = [
                a.run_id
                for a in ledger.document.skips(USER_SKIP)
                if prepared.skip.isdisjoint((a.pypto_sha, a.simpler_sha))
            ]
            ledger.supersede(unskipped)
            if unskipped and events is not None:
                verb = "is" if len(unskipped) == 1 else "are"
                taken = counted(len(unskipped), "commit")
                events.note(f"{taken} skipped by an earlier --skip {verb} tested")
            outcome = session.run()
        except BaseException as exc:
            tester.close(cancel=True)
            bad_input = isinstance(exc, BisectError) and exc.exit_code == 2
            if bad_input and len(ledger.document.attempts) == recorded:
                _abandon(ledger, workdir)
            if not isinstance(exc, EndpointFailure):
                raise
            failure = exc
            error = endpoint_error(failure)
            stopped = stopped_at_endpoint(prepared.good, prepared.commits, str(error))
            wall = ledger.finish_invocation()
            written = write_outcome(
                workdir,
                ledger.document.judged(session.tolerance),
                stopped,
                prepared.history,
                prepared.exporter,
                wall,
            )
            error.report = written.report
            raise error from None
        tester.close(cancel=False)  # speculative builds nobody needs now stop here
        wall = ledger.finish_invocation()  # before reading the document: it adds to it
        document = ledger.document.judged(session.tolerance)
        outcome.notes += limit_notes(document, session.tolerance)
        return write_outcome(workdir, document, outcome, prepared.history, prepared.exporter, wall)


def limit_notes(
    document: LedgerDocument, tolerance: Tolerance | None, in_force: bool = True
) -> list[str]:
    """What the reports say about --max-* limits: the limits in force (unless ``in_force`` is
    false: a --rethreshold headline says it already), and the failing runs they could not judge
    because the example printed no figure for any of them (a format the parser does not read,
    say), or none for one of several failing tensors, whose own FAIL then stands."""
    if tolerance is None or not tolerance.active:
        return []
    limits = [k for k, v in tolerance.limits.items() if v is not None]
    notes = []
    if in_force:
        notes.append(
            f"verdicts judged by the limits {tolerance.describe()} on each run's figures, not by "
            "the example's PASS/FAIL"
        )
    blind = [
        a for a in document.counted() if a.verdict is Verdict.BAD and not tolerance.reads(a.metrics)
    ]
    if blind:
        notes.append(
            f"{counted(len(blind), 'failing run')} printed no figure for "
            f"{' or '.join(limits)} (for some failing tensor, or at all), so the limits could not "
            "judge them and the example's own "
            f"FAIL stands (first: {blind[0].run_id}); check that its output prints the mismatch "
            "figures the reports list"
        )
    return notes


def stopped_at_endpoint(good: str, commits: list[str], message: str) -> Outcome:
    """What the reports say when an endpoint does not reproduce: no range was bisected."""
    # Only the endpoints: listing every untested candidate would bury the one line that matters.
    outcome = Outcome("inconclusive", LevelResult("pypto", [good, *commits[-1:]]))
    outcome.endpoint_failure = message
    outcome.notes.append(message)
    return outcome


def existing_cache(cache_dir: Path, hint: str = "") -> None:
    """A --cache-dir given to read or reuse a session must be there: a typo must not make a
    new, empty cache."""
    if not cache_dir.expanduser().is_dir():
        raise BadInput(f"--cache-dir {cache_dir}: no such directory{hint}")


def write_outcome(
    workdir: Path,
    doc: LedgerDocument,
    outcome: Outcome,
    history: History,
    exporter: SourceExporter,
    wall_s: float | None,
    reports: Path | None = None,
) -> RunResult:
    """`reports`: where the reports go (default: the workdir)."""
    facts = gather_facts(doc, outcome, history, exporter, workdir, wall_s)
    json_path, md_path, data = write_reports(reports or workdir, doc, outcome, facts)
    return RunResult(outcome, json_path, md_path, data)
