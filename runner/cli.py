"""The `bisect-precision-docker` command: parse, call, print. No bisect logic lives here."""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from typer import _click
from typer.core import TyperArgument
from typer.main import get_command

from runner import __version__
from runner.config import ENV_PREFIX, load_settings
from runner.errors import (
    STOP_SIGNALS,
    BadInput,
    BisectError,
    EndpointsDoNotReproduce,
    InfrastructureError,
)
from runner.wording import counted

PIPE_CLOSED = 128 + signal.SIGPIPE  # 141: how the shell reports a reader that went away


# A console's reader went away (the command ends with 141) or its file is on a full disk (4).
_PIPE: dict[str, Any] = {"closed": False, "code": PIPE_CLOSED}


class _Stream:
    """sys.stdout or sys.stderr for a console, whose reader may go away (`status | head -1`,
    `run 2>&1 | head`): the command then ends with 141, as a tool killed by SIGPIPE does, not
    with 1, which means inconclusive here, and without a word (no one is left to read it).

    Later writes go nowhere. Where stdout closes on the main thread the command ends there; a
    closed stderr (a run's progress, written from any thread) stops the command as Ctrl-C does,
    so a run removes its containers and keeps its ledger resumable.
    """

    def __init__(self, name: str) -> None:
        self.name = name

    @property
    def _stream(self) -> Any:
        return getattr(sys, self.name)

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        """A reader gone (141), or the output's file on a full disk (`run > bisect.log` in a
        CI job: 4, the disk being infrastructure, said on stderr when that still works)."""
        if isinstance(exc, BrokenPipeError):
            code = PIPE_CLOSED
        elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
            code = InfrastructureError.exit_code
        else:
            raise exc
        first = self._closed(code)
        if first and code != PIPE_CLOSED and self.name == "stdout":
            with contextlib.suppress(OSError):
                sys.stderr.write(
                    "error: the disk is full (writing the output to stdout): free space there, "
                    "then run again; what the ledger holds is kept\n"
                )
                sys.stderr.flush()
        # Where stdout fails on the main thread the command ends there; a failing stderr (a
        # run's progress, written from any thread) stops the command as Ctrl-C does.
        if self.name == "stdout" and threading.current_thread() is threading.main_thread():
            raise typer.Exit(_PIPE["code"])
        if first:
            os.kill(os.getpid(), signal.SIGINT)

    def _closed(self, code: int) -> bool:
        """Later writes (and the interpreter's last flush) go nowhere instead of failing again;
        whether this is the first stream to fail (its code is the command's)."""
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())
        first = not _PIPE["closed"]
        if first:
            _PIPE["code"] = code
        _PIPE["closed"] = True
        return first

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the real stream's
        return getattr(self._stream, name)


def _stderr_console(**options: Any) -> Console:
    return Console(file=_Stream("stderr"), highlight=False, soft_wrap=True, **options)  # type: ignore[arg-type]


ERR = _stderr_console(markup=False)
OUT = Console(file=_Stream("stdout"), highlight=False, soft_wrap=True, markup=False)  # type: ignore[arg-type]
_DEBUG = {"on": False}
_INTERRUPT = {"said": False}  # a command said "interrupted" itself
INTERRUPTED = 130


class _App(typer.Typer):
    """Typer with one-line errors: usage mistakes and tool errors never print a box or traceback."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        argv = list(sys.argv[1:])
        _DEBUG["on"] = "--debug" in argv
        try:
            command = get_command(self)
            _no_argument_types(command)
            code = command.main(
                args=argv, prog_name="bisect-precision-docker", standalone_mode=False
            )
        except _click.exceptions.NoArgsIsHelpError as exc:
            # `bisect-precision-docker` or `cache` alone: the help it asks for, on stdout, and
            # one line of error as for any other usage mistake.
            OUT.print(exc.format_message().rstrip())
            ERR.print("error: missing command: pick one of those listed above")
            sys.exit(exc.exit_code)
        except _click.exceptions.ClickException as exc:
            said = exc.format_message()
            if isinstance(exc, _click.exceptions.UsageError):
                said += " (see --help)"
            ERR.print(f"error: {said}")
            if _answers_in_json(argv):  # a typo in a flag is an answer too
                OUT.print_json(data={"error": said, "exit_code": exc.exit_code})
            sys.exit(exc.exit_code)
        except (typer.Abort, KeyboardInterrupt):  # (the latter before click took over)
            if _PIPE["closed"]:
                sys.exit(_PIPE["code"])
            ERR.print("interrupted")
            sys.exit(INTERRUPTED)
        if code == INTERRUPTED and _PIPE["closed"]:
            # Stopped by its own output failing (while it said an error, say): typer made that
            # interrupt 130, but the cause is the reader or the disk.
            code = _PIPE["code"]
        elif code == INTERRUPTED and not _INTERRUPT["said"]:
            ERR.print("interrupted")  # stopped before a command's own handling (its imports)
        sys.exit(code if isinstance(code, int) else 0)


def _answers_in_json(argv: list[str]) -> bool:
    """`run ... --json`, which always answers on stdout, even when its flags do not parse."""
    words = [a for a in argv if not a.startswith("-")]
    return bool(words) and words[0] == "run" and "--json" in argv


def _no_argument_types(command: Any) -> None:
    """Typer prints an argument's Python type beside its metavar (`RUN_ID <str>`): drop it."""
    for param in getattr(command, "params", []):
        if isinstance(param, TyperArgument):
            param.display_type = lambda ctx: ""  # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        _no_argument_types(sub)


app = _App(
    name="bisect-precision-docker",
    help="Find the pypto (or simpler) commit behind a numerical-precision regression, "
    "building and running every tested commit in its own container.",
    add_completion=True,
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
)
cache_app = typer.Typer(help="Inspect and prune the wheel cache.", no_args_is_help=True)
app.add_typer(cache_app, name="cache")


def _interrupt_on_sigterm() -> None:
    """CI runners and `timeout` stop jobs with SIGTERM, a dropped ssh session sends SIGHUP: treat
    both like Ctrl-C so the containers are removed and the ledger stays resumable.

    Only the first of them interrupts: a second Ctrl-C, pressed while the run removes its
    containers, would cut that short and leave one behind. It is said to be ignored; a third
    one ends the process at once (the next run removes what is left)."""
    stops = [0]

    def handler(signum: int, frame: object) -> None:
        stops[0] += 1
        if stops[0] == 1:
            raise KeyboardInterrupt
        if stops[0] == 2:
            ERR.print(
                "stopping: removing this run's containers first (once more ends it at once; "
                "the next run removes what is left)"
            )
            return
        # A plain write: the console may be mid-line in another thread, holding its lock.
        with contextlib.suppress(OSError):
            os.write(
                2,
                b"\ninterrupted at once: containers of this run may be left; the next run or "
                b"`bisect-precision-docker cleanup` removes them\n",
            )
        os._exit(INTERRUPTED)

    for number in STOP_SIGNALS:
        with contextlib.suppress(ValueError):  # (called off the main thread: nothing to set)
            signal.signal(number, handler)


@contextmanager
def guarded(interrupted_hint: str = "", said: list[str] | None = None) -> Iterator[None]:
    """Map every failure to one line on stderr and the documented exit code; `said` gets
    that line (without "error: "), for a command that also answers in JSON."""

    def tell(line: str, **options: Any) -> None:
        ERR.print(line, **options)
        if said is not None:
            said.append(line.removeprefix("error: "))

    try:
        yield
    except typer.Exit:
        raise
    except BisectError as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        tell(f"error: {exc}")
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        # Cleaned up and on the way out: another Ctrl-C must not turn exit 130 into a death by
        # signal at interpreter shutdown.
        with contextlib.suppress(ValueError):  # not the main thread: nothing to ignore there
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        if _PIPE["closed"]:  # stopped because the output's reader went away, or its disk filled
            raise typer.Exit(_PIPE["code"]) from None
        tell(f"interrupted{': ' + interrupted_hint if interrupted_hint else ''}")
        _INTERRUPT["said"] = True
        raise typer.Exit(INTERRUPTED) from None
    except Exception as exc:
        if _DEBUG["on"]:
            traceback.print_exc()
        known = _storage_error(exc) or _engine_error(exc)
        if known is not None:
            tell(f"error: {known}", markup=False)
            raise typer.Exit(known.exit_code) from None
        tell(
            f"error: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)"
        )
        raise typer.Exit(InfrastructureError.exit_code) from None


def _storage_error(exc: BaseException) -> BisectError | None:
    """A full disk (an infrastructure fault, exit 4) or a place the tool may not write (bad
    input, exit 2), said as such instead of as an unexpected error; None for anything else."""
    if not isinstance(exc, OSError) or exc.errno is None:
        return None
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        full = f"the disk is full (writing{where})" if where else "the disk is full"
        return InfrastructureError(
            f"{full}: free space under the workdir and the cache, or point --workdir or "
            "--cache-dir elsewhere (`cache prune` frees cached wheels), then run again; what "
            "the ledger holds is kept"
        )
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return BadInput(
            f"cannot write{where}: {exc.strerror}; use a --workdir (or --cache-dir) this user "
            "can write"
        )
    return None


def _engine_error(exc: BaseException) -> BisectError | None:
    """The Docker Engine stopped answering mid-run (it died, or hangs past the client's read
    timeout) where no layer below said it in words: an infrastructure fault, exit 4."""
    from runner.execute import ENGINE_ERRORS
    from runner.verdict import truncate

    if not isinstance(exc, ENGINE_ERRORS):
        return None
    detail = truncate(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 160)
    return InfrastructureError(
        f"the Docker Engine stopped answering ({type(exc).__name__}: {detail}); check that "
        "dockerd runs and `docker info` answers, then run again to resume (nothing recorded is "
        "lost)"
    )


def _version(value: bool) -> None:
    if value:
        OUT.print(f"bisect-precision-docker {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    _DEBUG["on"] = debug
    _refuse_undecodable()
    # Every command: `reproduce` and `export` leave a container or half a bundle when stopped
    # mid-way otherwise, and a CI job's cancel or `timeout` sends SIGTERM, not Ctrl-C.
    _interrupt_on_sigterm()


def _refuse_undecodable() -> None:
    """An argument or setting that is not UTF-8 (a path with a Latin-1 byte) cannot go into
    the ledger's JSON nor to the Docker Engine: said before anything is made, not as an
    unexpected error half-way into a new workdir."""
    given = [("argument ", text) for text in sys.argv[1:]]
    given += [(f"{name}=", v) for name, v in os.environ.items() if name.startswith(ENV_PREFIX)]
    for what, text in given:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(text).decode("utf-8", "backslashreplace")
            said = (
                f"{what}{shown} is not valid UTF-8: the ledger (JSON) and the Docker Engine "
                "take UTF-8 paths only; rename it or use another path"
            )
            ERR.print(f"error: {said}", markup=False)
            if _answers_in_json(sys.argv[1:]):
                OUT.print_json(data={"error": said, "exit_code": BadInput.exit_code})
            raise typer.Exit(BadInput.exit_code) from None


WorkdirOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="DIR", help="Holds ledger.json, runs/, report.md, report.json [./bisect-precision]."
    ),
]
CacheOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="DIR",
        help="Wheel cache and source mirrors [$BISECT_PRECISION_CACHE or the user cache dir].",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="FILE",
        help="Config file [$BISECT_PRECISION_CONFIG, else ./bisect-precision.toml when present].",
    ),
]
PyptoOpt = Annotated[
    Path | None, typer.Option(metavar="DIR", help="The pypto checkout (only read).")
]

SimplerOpt = Annotated[
    Path | None,
    typer.Option(
        metavar="DIR",
        help="A simpler clone with commits the checkout's submodule lacks (read); "
        "shorthand for --submodule-source runtime=DIR.",
    ),
]

GoodOpt = Annotated[
    str | None,
    typer.Option(metavar="REV", help="Known-good pypto revision (config: known_good)."),
]

BadOpt = Annotated[
    str | None, typer.Option(metavar="REV", help="Known-bad revision [HEAD of --pypto].")
]

BaseImageOpt = Annotated[
    str | None, typer.Option(metavar="IMAGE", help="CANN-based image to build and run in.")
]

SubmoduleSourceOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="PATH=DIR",
        help="A clone holding commits the checkout's submodule at PATH lacks (repeatable).",
    ),
]

SubmodulePathOpt = Annotated[
    str | None,
    typer.Option(metavar="PATH", help="Where the simpler gitlink sits in pypto [runtime]."),
]
OmitSubmoduleOpt = Annotated[
    list[str] | None,
    typer.Option(metavar="PATH", help="Leave this submodule out of source exports (repeatable)."),
]
PythonOpt = Annotated[
    str | None, typer.Option(metavar="PYTHON", help="Python in the image [python3].")
]

BuildPinOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="JSON",
        help='Build tools for some commits, e.g. \'{"requirements": '
        '["scikit-build-core==0.12.2"], "until": "2026-03-01"}\' (repeatable).',
    ),
]

ResolveByDateOpt = Annotated[
    bool | None,
    typer.Option(
        "--resolve-by-date/--no-resolve-by-date",
        help="Pick build tools released before each commit's date [on].",
    ),
]

WheelhouseOpt = Annotated[
    Path | None,
    typer.Option(metavar="DIR", help="Wheels to provision build environments offline."),
]
SessionOpt = Annotated[
    str | None,
    typer.Option(
        metavar="NAME",
        help="An earlier session of the workdir, by the name `status` lists.",
    ),
]


def _choices(*words: str) -> Any:
    """Shell completion for an option that takes one of a few words."""
    return lambda incomplete: [word for word in words if word.startswith(incomplete)]


def _pairs(values: list[str] | None, flag: str, shape: str) -> dict[str, str] | None:
    """Repeated NAME=VALUE flags as a dict; a malformed one is a one-line error."""
    if not values:
        return None
    result: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise BadInput(f"{flag} {item!r}: give {shape}")
        earlier = result.setdefault(key.strip(), value)
        if earlier != value:  # the later one would win without a word
            raise BadInput(f"{flag} {key.strip()} is given twice ({earlier} and {value}): give one")
    return result


def _pins(values: list[str] | None) -> list[Any] | None:
    if not values:
        return None
    pins = []
    for item in values:
        try:
            pins.append(json.loads(item))
        except json.JSONDecodeError as exc:
            raise BadInput(f"--build-pin {item!r}: not a JSON table ({exc.msg})") from None
    return pins


@app.command()
def run(
    pypto: PyptoOpt = None,
    lib: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="The pypto-lib checkout with the example (only read)."),
    ] = None,
    simpler: SimplerOpt = None,
    script: Annotated[
        str | None, typer.Option(metavar="PATH", help="The example, relative to --lib.")
    ] = None,
    good: GoodOpt = None,
    bad: BadOpt = None,
    platform: Annotated[
        str | None,
        typer.Option(
            metavar="PLATFORM",
            help="a2a3, a5 (NPU) or a2a3sim, a5sim [a2a3].",
            autocompletion=_choices("a2a3", "a5", "a2a3sim", "a5sim"),
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            metavar="N[,N...]",
            help="NPU card number, or a comma list: one test per card per round [0].",
        ),
    ] = None,
    cards_per_test: Annotated[
        int | None,
        typer.Option(metavar="N", help="Cards one example run needs (distributed examples) [1]."),
    ] = None,
    build_jobs: Annotated[
        int | None,
        typer.Option(metavar="N", help="Wheel builds at once [from the cores and memory]."),
    ] = None,
    prefetch: Annotated[
        bool | None,
        typer.Option(
            "--prefetch/--no-prefetch",
            help="Build what the next rounds may test while an example runs [on].",
        ),
    ] = None,
    executor: Annotated[
        str | None,
        typer.Option(
            metavar="NAME",
            help="local, or ray (a Ray cluster; needs the ray extra) [local].",
            autocompletion=_choices("local", "ray"),
        ),
    ] = None,
    ray_address: Annotated[
        str | None,
        typer.Option(metavar="ADDRESS", help="Ray cluster address for --executor ray [auto]."),
    ] = None,
    base_image: BaseImageOpt = None,
    workdir: WorkdirOpt = None,
    cache_dir: CacheOpt = None,
    submodule_path: SubmodulePathOpt = None,
    submodule_source: SubmoduleSourceOpt = None,
    omit_submodule: OmitSubmoduleOpt = None,
    skip: Annotated[
        list[str] | None,
        typer.Option(
            metavar="REV",
            help="Take this pypto or simpler commit as untestable, as `git bisect skip` does "
            "(a build that hangs; repeatable).",
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Seconds per example run [1800].")
    ] = None,
    build_timeout: Annotated[
        float | None, typer.Option(metavar="SECONDS", help="Seconds per wheel build [3600].")
    ] = None,
    infra_retries: Annotated[
        int | None,
        typer.Option(
            metavar="N",
            help="Consecutive infrastructure failures tolerated before stopping with exit 4 [3].",
        ),
    ] = None,
    device_mode: Annotated[
        str | None,
        typer.Option(
            metavar="MODE",
            help="explicit (default), privileged or ascend-runtime.",
            autocompletion=_choices("explicit", "privileged", "ascend-runtime"),
        ),
    ] = None,
    device_map: Annotated[
        list[str] | None,
        typer.Option(
            metavar="HOST:CONTAINER",
            help="Device to pass instead of the NPU set (repeatable).",
        ),
    ] = None,
    build_network: Annotated[
        bool | None,
        typer.Option("--build-network/--no-build-network", help="Allow network during builds."),
    ] = None,
    build_command: Annotated[
        str | None, typer.Option(metavar="CMD", help="Builds a wheel into /out from the source.")
    ] = None,
    build_env: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="Environment of the builds (repeatable)."),
    ] = None,
    build_pin: BuildPinOpt = None,
    resolve_by_date: ResolveByDateOpt = None,
    wheelhouse: WheelhouseOpt = None,
    run_env: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="Environment of the example runs (repeatable; KEY= removes a default).",
        ),
    ] = None,
    pto_isa_root: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="pto-isa checkout mounted read-only for builds and runs."),
    ] = None,
    ptoas_root: Annotated[
        Path | None, typer.Option(metavar="DIR", help="ptoas install mounted read-only for runs.")
    ] = None,
    ascend_home_path: Annotated[
        str | None, typer.Option(metavar="PATH", help="ASCEND_HOME_PATH inside the containers.")
    ] = None,
    python: PythonOpt = None,
    cpus: Annotated[
        float | None, typer.Option(metavar="CPUS", help="CPU limit per container.")
    ] = None,
    memory: Annotated[
        str | None,
        typer.Option(
            metavar="SIZE", help="Memory limit per build and example container (8g, 512m)."
        ),
    ] = None,
    extra_arg: Annotated[
        list[str] | None,
        typer.Option(metavar="ARG", help="Extra argument for the example (repeatable)."),
    ] = None,
    verdict_good: Annotated[
        list[str] | None,
        typer.Option(
            metavar="REGEX", help="Regex marking a pass (repeatable; replaces the defaults)."
        ),
    ] = None,
    verdict_bad: Annotated[
        list[str] | None,
        typer.Option(
            metavar="REGEX",
            help="Regex marking a precision failure (repeatable; replaces the defaults).",
        ),
    ] = None,
    config: ConfigOpt = None,
    new_session: Annotated[
        bool, typer.Option(help="Start over; the old ledger and its runs are kept.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Quiet; print report.json to stdout.")
    ] = False,
    verify: Annotated[
        bool | None,
        typer.Option("--verify/--no-verify", help="Check that good is good and bad is bad first."),
    ] = None,
    drift_check: Annotated[
        bool | None,
        typer.Option(
            "--drift-check/--no-drift-check",
            help="At the end, run the last good commit once more, and the known-good one "
            "when that run failed or is not recent (bad: exit 3).",
        ),
    ] = None,
    confidence: Annotated[
        float | None,
        typer.Option(
            metavar="P", help="Stop when the likeliest culprit reaches this probability [0.95]."
        ),
    ] = None,
    repeat: Annotated[
        int | None,
        typer.Option(
            metavar="N", help="Fixed runs per tested commit, judged by --policy (no confidence)."
        ),
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            metavar="POLICY",
            help="any-fail or majority: how --repeat runs are judged.",
            autocompletion=_choices("any-fail", "majority"),
        ),
    ] = None,
    max_mismatch_ratio: MismatchOpt = None,
    max_abs_diff: AbsDiffOpt = None,
    max_rel_diff: RelDiffOpt = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Stream build and run logs.")
    ] = False,
) -> None:
    """Bisect pypto (and simpler inside a culprit bump), resuming from the ledger."""
    from runner.progress import ConsoleProgress
    from runner.report import strict_json
    from runner.workflow import run_bisect

    verdict = {"good": verdict_good or None, "bad": verdict_bad or None}
    flags = {
        "pypto": pypto,
        "simpler": simpler,
        "lib": lib,
        "script": script,
        "known_good": good,
        "bad": bad,
        "platform": platform,
        "device": device,
        "cards_per_test": cards_per_test,
        "build_jobs": build_jobs,
        "prefetch": prefetch,
        "executor": executor,
        "ray_address": ray_address,
        "base_image": base_image,
        "workdir": workdir,
        "cache_dir": cache_dir,
        "submodule_path": submodule_path,
        "omit_submodules": omit_submodule or None,
        "skip": skip or None,
        "timeout": timeout,
        "build_timeout": build_timeout,
        "infra_retries": infra_retries,
        "device_mode": device_mode,
        "device_map": device_map or None,
        "build_network": build_network,
        "build_command": build_command,
        "resolve_by_date": resolve_by_date,
        "wheelhouse": wheelhouse,
        "pto_isa_root": pto_isa_root,
        "ptoas_root": ptoas_root,
        "ascend_home_path": ascend_home_path,
        "python": python,
        "cpus": cpus,
        "memory": memory,
        "extra_args": extra_arg or None,
        "verdict": {k: v for k, v in verdict.items() if v} or None,
        "verify": verify,
        "confidence": confidence,
        "repeat": repeat,
        "policy": policy,
        "max_mismatch_ratio": max_mismatch_ratio,
        "max_abs_diff": max_abs_diff,
        "max_rel_diff": max_rel_diff,
        "drift_check": drift_check,
    }
    hint = "nothing recorded is lost; rerun the same command to resume"
    said: list[str] = []
    pending = {"json": json_out}  # stdout still owes a --json answer
    with _json_error(pending, said), guarded(hint, said):
        flags["submodule_sources"] = _pairs(submodule_source, "--submodule-source", "PATH=DIR")
        flags["build_env"] = _pairs(build_env, "--build-env", "KEY=VALUE")
        flags["run_env"] = _pairs(run_env, "--run-env", "KEY=VALUE")
        flags["build_pins"] = _pins(build_pin)
        settings = load_settings(flags, config)
        quiet = json_out
        console = _stderr_console()
        progress = ConsoleProgress(console, quiet=quiet)
        with progress:
            try:
                result = run_bisect(
                    settings,
                    new_session=new_session,
                    events=progress,
                    phase=progress.phase,
                    echo=progress.echo if verbose and not quiet else None,
                    ahead=progress.ahead,
                )
            except EndpointsDoNotReproduce as stop:
                if json_out and stop.report is not None:  # CI reads stdout whatever the exit
                    OUT.print_json(data=strict_json(stop.report))
                    pending["json"] = False  # answered: no error object after it
                raise
    if json_out:
        OUT.print_json(data=strict_json(result.report))
    else:
        _print_summary(result.report, result.report_md)
    raise typer.Exit(result.outcome.exit_code)


@contextmanager
def _json_error(pending: dict[str, bool], said: list[str]) -> Iterator[None]:
    """`run --json` that stops without a report still answers on stdout: the one line said on
    stderr and the exit code, as {"error": ..., "exit_code": N}, for a job that parses it."""
    try:
        yield
    except typer.Exit as stop:
        if pending["json"] and stop.exit_code and said and not _PIPE["closed"]:
            OUT.print_json(data={"error": said[-1], "exit_code": stop.exit_code})
        raise


def _threshold(report: dict) -> float:
    return float((report.get("confidence") or {}).get("threshold") or 1.0)


def _print_confidence(level: dict | None, threshold: float = 1.0) -> None:
    """The culprit's probability, the runner-up and the flake rates, when the search had them."""
    from runner.confidence import why_low

    if not level:
        return
    if level.get("low_confidence"):
        candidates = level["low_confidence"]
        listed = ", ".join(f"{c['sha'][:12]} {c['probability']:.0%}" for c in candidates[:5])
        why = why_low(candidates[0]["probability"], threshold)
        OUT.print(f"inconclusive: low confidence; candidates: {listed}{why}")
        return
    if level.get("probability") is None:
        return
    line = f"  probability {level['probability']:.1%}"
    if level.get("runner_up"):
        line += (
            f", runner-up {level['runner_up']['sha'][:12]} {level['runner_up']['probability']:.1%}"
        )
    if level.get("false_fail") is not None:
        guess = " (a prior guess: no run disagreed)" if level.get("rates_from_prior") else ""
        line += (
            f"; flake rates{guess}: false fail {level['false_fail']:.1%}, "
            f"false pass {level['false_pass']:.1%}"
        )
    OUT.print(line)


def _print_candidates(level: dict) -> None:
    subjects = level.get("candidate_subjects") or {}
    for sha in level["candidates"]:
        OUT.print(f"  {sha} {subjects.get(sha, '')}".rstrip(), markup=False)


def _print_summary(report: dict, md_path: Path) -> None:
    from runner.report import source_also

    source = report["source"]
    pypto = report["pypto"]
    carrier = (report.get("split") or {}).get("carrier")
    drifted = bool(report.get("drift"))
    untrusted = " (not trusted: the environment drifted, see below)" if drifted else ""
    OUT.print(f"regression source: {source}{source_also(source, carrier)}{untrusted}")
    if pypto["first_bad"]:
        commit = pypto.get("commit") or {}
        which = "first bad pypto commit the search found" if drifted else "first bad pypto commit"
        OUT.print(f"{which}: {pypto['first_bad']} {commit.get('subject', '')}")
        _print_confidence((report.get("confidence") or {}).get("pypto"), _threshold(report))
    else:
        OUT.print(f"the first bad pypto commit is one of {len(pypto['candidates'])}:")
        _print_candidates(pypto)
    simpler = report.get("simpler")
    if simpler:
        if simpler["culprit"]:
            commit = simpler.get("commit") or {}
            OUT.print(
                f"simpler commit: {simpler['culprit']} {commit.get('subject', '')} "
                f"({simpler['direction']} pointer move)"
            )
            _print_confidence((report.get("confidence") or {}).get("simpler"), _threshold(report))
        else:
            OUT.print(f"the simpler commit is one of {len(simpler['candidates'])}:")
            _print_candidates(simpler)
    if pypto["first_bad"] is None:
        _print_confidence((report.get("confidence") or {}).get("pypto"), _threshold(report))
    if report.get("split"):
        OUT.print(report["split"]["summary"])
    for note in report.get("notes", []):
        warning = note.startswith(("the culprit's build is identical", "the environment drifted"))
        OUT.print(f"{'warning' if warning else 'note'}: {note}")
    if report.get("triage"):
        OUT.print(f"triage: {report['triage']['summary']}")
    if report.get("reproduce"):
        OUT.print(f"reproduce with: {report['reproduce']}")
    OUT.print(f"report: {md_path}")


def _workdir(workdir: Path | None, config: Path | None = None) -> Path:
    """--workdir, else the config file's `workdir`, else ./bisect-precision."""
    if workdir is not None:
        return workdir
    return load_settings({}, config).workdir


@app.command()
def status(
    workdir: WorkdirOpt = None,
    config: ConfigOpt = None,
    cache_dir: CacheOpt = None,
    session: SessionOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
) -> None:
    """Where a bisect stands: the range per level, steps done and left, the last verdicts."""
    from runner.ledger import earlier_sessions, in_use
    from runner.replay import replay
    from runner.workflow import ledger_path

    with guarded():
        root = _workdir(workdir, config)
        state = replay(root, cache_dir, session)
        ledger = ledger_path(root.resolve())
        data = _status_data(state, running=session is None and in_use(ledger))
        data["session"] = session
        data["earlier_sessions"] = list(earlier_sessions(ledger))
    if json_out:
        OUT.print_json(data=data)
        return
    # Stopped at an endpoint, nothing was bisected: its range says nothing.
    for level in data["levels"] if data["endpoint_failure"] is None else []:
        left, steps = level["remaining"], level["steps_left"]
        about = f"about {counted(steps, 'step')} left" if steps else "done"
        if level.get("likeliest") is not None:
            # The confidence search: a flaky record has no plain good/bad bounds to show.
            if not steps and any(not other["done"] for other in data["levels"][1:]):
                # It bisects the bump it found now, and every run of either level weighs on
                # both: below the threshold, that is not the level done.
                about = "judged with the simpler level from here"
            held = level["holding_99"]
            what = (
                f"likeliest culprit {level['likeliest'][:12]} (its removal brought the regression)"
                if level["likeliest_removed"]
                else f"likeliest first bad {level['likeliest'][:12]}"
            )
            OUT.print(
                f"{level['level']} level: {what} ({level['probability']:.1%}); {held} "
                f"{'candidates hold' if held != 1 else 'candidate holds'} 99% of the probability; "
                f"{counted(level['runs'], 'run')}, {about}"
            )
            continue
        OUT.print(
            f"{level['level']} level: {counted(left, 'candidate')} left between "
            f"{level['last_good'][:12]} (good) and {level['first_bad'][:12]} (bad); "
            f"{counted(level['runs'], 'run')}, {about}"
        )
    OUT.print(f"state: {data['state']}")
    for package, counts in data["ccache"].items():
        rate = counts["hits"] / counts["compiled"] if counts["compiled"] else 0.0
        OUT.print(
            f"ccache {package}: {counts['hits']}/{counts['compiled']} compilations hit ({rate:.0%})"
        )
    for step in data["last"]:
        OUT.print(
            f"  {step['verdict']:4} {step['level']:7} pypto {step['pypto'][:12]} "
            f"simpler {(step['simpler'] or 'none')[:12]} {step['reason']} ({step['run_id']})"
        )
    if data["earlier_sessions"]:
        OUT.print(f"earlier sessions (--session NAME): {', '.join(data['earlier_sessions'])}")


def _status_data(state: Any, running: bool = False) -> dict:
    """`running`: a run holds the workdir now (else an unfinished session is stopped)."""
    outcome = state.outcome
    levels = []
    for result in (outcome.pypto, outcome.simpler):
        if result is None:
            continue
        # A level with an answer shows it (a joint chain's runs may have placed it); an open one,
        # what plain bisection would still search.
        lo, hi = result.bounds
        likeliest = probability = None
        removed = False
        # Before any candidate between the ends has run, the likeliest is the prior's pick.
        inside = any(0 < i < len(result.candidates) - 1 for i in result.observations)
        if (
            result.belief is not None
            and result.repeat is None
            and result.inconclusive is None
            and (inside or result.done)
        ):
            index, probability = result.belief.ranked(limit=1)[0]
            if result.found is not None:
                index, probability = result.found, result.belief.probabilities[result.found]
            likeliest = outcome.blamed(result, index)
            removed = likeliest != result.candidates[index]
        levels.append(
            {
                "likeliest": likeliest,
                # Going backward: the commit whose removal brought the regression back.
                "likeliest_removed": removed,
                "probability": probability,
                "runs": sum(len(seen) for seen in result.observations.values()),
                "level": result.level,
                "candidates": len(result.candidates) - 1,
                "last_good": result.candidates[lo],
                "first_bad": result.candidates[hi],
                # The range shown: what plain bisection would still search (the confidence
                # search's likeliest candidates are in `suspects`).
                "remaining": max(1, hi - lo),
                "suspects": len(result.suspects),
                # How many of the likeliest it takes to hold 99 % of the probability.
                "holding_99": len(result.belief.ranked()) if result.belief else None,
                "tests": sum(1 for i in result.verdicts if 0 < i < len(result.candidates) - 1),
                "steps_left": result.steps_left,
                "done": result.done,
            }
        )
    if state.endpoint_failure is not None:
        text = f"stopped: the known-{state.endpoint_failure.which} endpoint did not reproduce"
    elif outcome.pending is not None and running:
        text = f"in progress: next {outcome.pending}"
    elif outcome.pending is not None:
        text = (
            f"stopped before the end (no run holds the workdir): next {outcome.pending}; "
            "rerun the same command to resume"
        )
    elif outcome.drift:
        text = (
            f"finished, not trusted: the environment drifted ({' and '.join(outcome.drift)} "
            "failed when re-run at the end; exit 3)"
        )
    else:
        text = f"finished: source {outcome.source}"
        if outcome.exit_code == 1 and outcome.source != "inconclusive":
            # Which level is left open: simpler's, or pypto's bump that brought a simpler culprit.
            open_level = outcome.source
            if outcome.source == "simpler" and outcome.simpler_culprit is not None:
                open_level = "pypto"
            text += f", no single {open_level} commit (inconclusive: exit 1)"
    attempts = state.document.attempts
    return {
        "state": text,
        "finished": outcome.pending is None and state.endpoint_failure is None,
        "endpoint_failure": None
        if state.endpoint_failure is None
        else state.endpoint_failure.which,
        "drift": list(outcome.drift),
        "source": outcome.source if outcome.pending is None else None,
        "levels": levels,
        "attempts": len(attempts),
        "last": [
            {
                "run_id": a.run_id,
                "level": a.level,
                "pypto": a.pypto_sha,
                "simpler": a.simpler_sha,
                "verdict": a.verdict.value,
                "reason": a.reason,
                "ccache": {k: list(v) for k, v in a.ccache.items()},
            }
            for a in attempts[-5:]
        ],
        "ccache": _ccache_totals(attempts),
    }


def _ccache_totals(attempts: Any) -> dict[str, Any]:
    """ccache hits and compilations over the session's builds, per package."""
    totals: dict[str, list[int]] = {}
    for attempt in attempts:
        for package, (hits, misses) in attempt.ccache.items():
            done = totals.setdefault(package, [0, 0])
            done[0] += hits
            done[1] += hits + misses
    return {k: {"hits": v[0], "compiled": v[1]} for k, v in sorted(totals.items())}


MismatchOpt = Annotated[
    float | None,
    typer.Option(
        metavar="RATIO",
        min=0.0,
        max=1.0,
        help="Bad when more than this share of elements mismatch (from the figures).",
    ),
]
AbsDiffOpt = Annotated[
    float | None,
    typer.Option(
        metavar="DIFF", min=0.0, help="Bad when the max abs diff exceeds this (from the figures)."
    ),
]
RelDiffOpt = Annotated[
    float | None,
    typer.Option(
        metavar="DIFF", min=0.0, help="Bad when the max rel diff exceeds this (from the figures)."
    ),
]


@app.command()
def report(
    workdir: WorkdirOpt = None,
    config: ConfigOpt = None,
    cache_dir: CacheOpt = None,
    session: SessionOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print report.json instead.")] = False,
    rethreshold: Annotated[
        bool,
        typer.Option(
            "--rethreshold",
            help="Re-judge every attempt from its recorded figures with the --max-* limits "
            "given here or in the config file or environment, as `run` takes them (none: the "
            "example's own PASS/FAIL); starts no container.",
        ),
    ] = False,
    max_mismatch_ratio: MismatchOpt = None,
    max_abs_diff: AbsDiffOpt = None,
    max_rel_diff: RelDiffOpt = None,
) -> None:
    """Rewrite report.md and report.json from the ledger and print the report (an earlier
    session's go to sessions/NAME/ in the workdir)."""
    from runner.replay import rewrite_reports
    from runner.report import strict_json
    from runner.verdict import Tolerance

    limits = Tolerance(max_mismatch_ratio, max_abs_diff, max_rel_diff)
    with guarded():
        if limits.active and not rethreshold:
            raise BadInput("--max-* limits on `report` need --rethreshold")
        if rethreshold:  # the limits as `run` takes them: flags over variables over the file
            flags = {"max_mismatch_ratio": max_mismatch_ratio, "max_abs_diff": max_abs_diff}
            flags["max_rel_diff"] = max_rel_diff
            limits = load_settings(flags, config).tolerance() or Tolerance()
        # While a run holds the workdir, the reports are shown from here, not written there.
        with tempfile.TemporaryDirectory(prefix="bisect-precision-report-") as aside:
            result = rewrite_reports(
                _workdir(workdir, config),
                cache_dir,
                session,
                limits if rethreshold else None,
                aside=Path(aside),
            )
            if json_out:
                OUT.print_json(data=strict_json(result.report))
            else:
                OUT.print(result.report_md.read_text(), markup=False)


@app.command()
def log(workdir: WorkdirOpt = None, session: SessionOpt = None, config: ConfigOpt = None) -> None:
    """Print the first level as a `git bisect log` that `git bisect replay` accepts."""
    from runner.findings import bisect_log
    from runner.history import History
    from runner.ledger import Ledger, earlier_session, to_git_bisect_log
    from runner.replay import replay
    from runner.workflow import ledger_path

    with guarded():
        folder = _workdir(workdir, config).resolve()
        path = ledger_path(folder)
        document = Ledger.read(path if session is None else earlier_session(path, session))
        history = None
        with suppress(BisectError, OSError):  # the checkout moved or is gone: shas alone replay
            history = History(Path(document.inputs.pypto_repo))
        text = None
        if history is not None:
            # Checked against the checkout as `status` and `report` check it: a ledger naming
            # commits it lacks or that lie outside the range is refused, not printed.
            boundary = replay(folder, session=session).outcome.pypto.first_bad
            tested = {a.pypto_sha for a in document.attempts}
            subjects = history.subjects(tested | {document.inputs.good, document.inputs.bad})
            text = bisect_log(document, history, subjects, boundary)
    OUT.print(text or to_git_bisect_log(document), markup=False, end="")


@app.command()
def reproduce(
    run_id: Annotated[
        str,
        typer.Argument(
            metavar="RUN_ID",
            help="A run id from the report or `status`, its number, or a pypto SHA.",
        ),
    ],
    workdir: WorkdirOpt = None,
    session: SessionOpt = None,
    config: ConfigOpt = None,
    cache_dir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="Wheel cache and source mirrors [the one the session ran with].",
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Stream logs.")] = False,
) -> None:
    """Run a recorded attempt again in a fresh container and compare the verdicts (an earlier
    session's attempt too: run ids are unique across the sessions of a workdir)."""
    from runner.reproduce import compare_wheels
    from runner.reproduce import reproduce as reproduce_run

    with guarded():
        original, again = reproduce_run(
            _workdir(workdir, config),
            run_id,
            echo=(lambda line: ERR.print(line.rstrip())) if verbose else None,
            session=session,
            note=ERR.print,
            cache_dir=cache_dir,
        )
    OUT.print(f"recorded:   {original.verdict.value} {original.reason} ({original.run_id})")
    where = f", {again.log_path}" if again.log_path else ""
    OUT.print(f"reproduced: {again.verdict.value} {again.reason} ({again.run_id}{where})")
    for line in compare_wheels(original, again):
        OUT.print(line)
    same = original.verdict == again.verdict
    OUT.print("the verdict reproduces" if same else "the verdict does NOT reproduce")
    raise typer.Exit(0 if same else 1)


def _size(text: str) -> int:
    units = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    raw = text.strip().lower().removesuffix("b").removesuffix("i")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    try:
        size = float(number) * units[unit]
    except ValueError:
        raise BadInput(f"--max-size {text}: give a size such as 500M or 20G") from None
    if not math.isfinite(size) or size < 0:
        raise BadInput(
            f"--max-size {text}: a size cannot be negative or infinite; give one such as 20G"
        )
    return int(size)


def _cache(cache_dir: Path | None, config: Path | None = None, *, existing: bool = False):
    """The wheel cache of --cache-dir, else of the config file's or environment's `cache_dir`;
    `existing`: a --cache-dir that is not there is a typo, not an empty cache."""
    from runner.wheels import WheelCache

    settings = load_settings({"cache_dir": cache_dir}, config)
    root = settings.cache_root()
    if root.exists() and not root.is_dir():
        raise BadInput(f"--cache-dir {root} is a file, not a directory")
    if existing and cache_dir is not None and not root.exists():
        raise BadInput(f"--cache-dir {root}: no such directory")
    return WheelCache(root / "wheels")


@cache_app.command("ls")
def cache_ls(
    cache_dir: CacheOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable.")] = False,
    config: ConfigOpt = None,
) -> None:
    """List cached wheels and recorded build failures, most recently used first."""
    with guarded():
        cache = _cache(cache_dir, config, existing=True)
        entries = sorted(cache.entries(), key=lambda e: e.last_used, reverse=True)
    rows = [
        {
            "package": e.package,
            "commit": e.commit,
            "ok": e.ok,
            "size": e.size,
            "last_used": e.last_used.isoformat(),
            "reason": e.reason,
            "key": e.key,
            "builder": e.builder,  # one commit built by two builders is two entries
            # a pypto built with another runtime than it pins: path -> that simpler commit
            "inputs": dict(e.inputs),
        }
        for e in entries
    ]
    if json_out:
        OUT.print_json(data=rows)
        return
    for row in rows:
        state = "wheel " if row["ok"] else "FAILED"
        builder = (row["builder"] or "").removeprefix("sha256:")[:12] or "-"
        built_with = "".join(f" (with {p} {sha[:12]})" for p, sha in row["inputs"].items())
        OUT.print(
            f"{row['package']:8} {row['commit'][:12]} {state} {row['size'] / 1e6:8.2f} MB "
            f"used {row['last_used'][:19]} builder {builder:12} {row['reason']}{built_with}"
        )
    size = sum(r["size"] for r in rows) / 1e6
    OUT.print(f"{counted(len(rows), 'entry', 'entries')}, {size:.2f} MB in {cache.root}")


def _confirm_remove_all(cache: Any) -> bool:
    """Only a person at a terminal can say yes; a script must say --all."""
    if not sys.stdin.isatty():
        raise BadInput(
            "cache prune without a --max-size above 0 would remove every cached wheel: "
            "pass --all to do that, or --max-size SIZE to keep the most recent"
        )
    entries = len(cache.entries())
    return typer.confirm(
        f"remove all {entries} entries ({cache.size() / 1e6:.2f} MB) from {cache.root}?",
        default=False,
        err=True,
    )


@cache_app.command("prune")
def cache_prune(
    cache_dir: CacheOpt = None,
    max_size: Annotated[
        str | None,
        typer.Option(metavar="SIZE", help="Keep at most this much (e.g. 20G), LRU first."),
    ] = None,
    failures: Annotated[
        bool, typer.Option("--failures", help="Forget recorded build failures only.")
    ] = False,
    everything: Annotated[
        bool, typer.Option("--all", help="Remove every entry without asking.")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Remove least recently used entries until the cache fits --max-size; removing everything
    needs --all, or a yes at the prompt."""
    from runner.wheels import dir_size

    with guarded():
        if everything and (max_size is not None or failures):
            other = "--max-size" if max_size is not None else "--failures"
            raise BadInput(f"--all removes every entry: it cannot go with {other}")
        cache = _cache(cache_dir, config, existing=True)
        if failures:
            removed = cache.remove_failures()
        else:
            limit = _size(max_size) if max_size is not None else None
            # --max-size 0 keeps nothing: the same as removing everything, so the same rule.
            if not limit and not everything and not _confirm_remove_all(cache):
                OUT.print("nothing removed")
                raise typer.Exit(1)
            removed = cache.prune(limit)
    OUT.print(
        f"removed {counted(len(removed), 'entry', 'entries')}; "
        f"{cache.size() / 1e6:.2f} MB of wheels left"
    )
    if failures and removed:
        OUT.print(
            "a session that recorded these failures keeps its skip verdicts: `run "
            "--new-session` builds those commits again"
        )
    kept = cache.in_use()
    if kept and not failures:
        OUT.print(
            f"kept {counted(len(kept), 'entry', 'entries')} "
            f"({sum(e.size for e in kept) / 1e6:.2f} MB) that a running session uses; prune "
            "again once it has finished"
        )
    # The rest of the cache directory is not the wheels': say what it holds rather than let
    # "0 MB left" pass for an empty cache.
    tools = cache.root.parent / "builders"
    if tools.is_dir():
        held = dir_size(tools)
        OUT.print(
            f"build-tool downloads for builder images: {held / 1e6:.2f} MB in {tools} "
            "(not pruned: `builder ls` shows what uses them)"
        )


@app.command("config-reference")
def config_reference_command(
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write here instead of stdout."),
    ] = None,
) -> None:
    """Print the settings reference (markdown, as in docs/config.md), generated from the model."""
    from runner.reference import config_reference

    text = config_reference()
    if output is None:
        OUT.print(text, markup=False, end="")
        return
    with guarded():
        try:
            output.write_text(text)
        except OSError as exc:
            raise BadInput(f"--output {output}: cannot write it ({exc.strerror})") from None


@app.command()
def cleanup(
    images: Annotated[
        bool,
        typer.Option(
            "--images",
            help="Also remove the per-commit test images and their shared layers (`reproduce` "
            "layers an attempt's image again; `export` it after that).",
        ),
    ] = False,
    builders: Annotated[
        bool,
        typer.Option(
            "--builders", help="Also remove the builder images (the build tools of each era)."
        ),
    ] = False,
    workdir: Annotated[
        Path | None,
        typer.Option(
            metavar="DIR",
            help="With --images: only the test images this workdir's sessions made or used "
            "(shared with other workdirs that tested the same pairs), those layered ahead of "
            "need too, and the layers no other image is made on.",
        ),
    ] = None,
) -> None:
    """Remove containers left by killed runs (and, with --images or --builders, images the tool
    made; an image a running container uses stays)."""
    from runner.builders import BUILDER_KIND
    from runner.execute import KIND_LABEL, LABEL, connect, remove_stale_containers
    from runner.images import list_images, remove_image, remove_recorded

    with guarded():
        recorded = None if workdir is None else _recorded_images(workdir, images, builders)
        client = connect()
        removed = remove_stale_containers(client)
        gone = kept = 0
        if recorded is not None:
            result = remove_recorded(client, recorded)
            shared = (
                f", {counted(result.shared, 'layer')} other images use kept"
                if result.shared
                else ""
            )
            in_use = f", {result.in_use} in use by running containers kept" if result.in_use else ""
            OUT.print(
                f"removed {counted(len(removed), 'container')} and "
                f"{counted(result.removed, 'image')} of {workdir}{shared}{in_use}"
            )
            return
        if images or builders:
            tool_images = [
                image
                for image in list_images(client, {"label": f"{LABEL}=1"})
                if (image.labels.get(KIND_LABEL) == BUILDER_KIND and builders)
                or (image.labels.get(KIND_LABEL) != BUILDER_KIND and images)
            ]
            # Test images before the shared layers they were made on, which cannot go first.
            for image in sorted(tool_images, key=lambda i: i.labels.get(KIND_LABEL) == "layer"):
                outcome = remove_image(client, image.id)
                gone += outcome == "removed"
                kept += outcome == "kept"
    in_use = f" ({kept} in use by running containers kept)" if kept else ""
    OUT.print(f"removed {counted(len(removed), 'container')} and {counted(gone, 'image')}{in_use}")


def _recorded_images(workdir: Path, images: bool, builders: bool) -> list[str]:
    """The test images every session of ``workdir`` recorded (`cleanup --workdir`)."""
    from runner.ledger import Ledger, earlier_sessions, in_use
    from runner.workflow import ledger_path

    if builders:
        raise BadInput(
            "--workdir limits --images to one workdir's test images; builders are shared by "
            "every workdir: give --images without --builders"
        )
    if not images:
        raise BadInput(
            "--workdir limits --images to one workdir's test images: add --images (containers "
            "left by killed runs go with `cleanup` alone)"
        )
    if not workdir.is_dir():
        raise BadInput(f"--workdir {workdir}: no such directory")
    path = ledger_path(workdir.resolve())
    if not path.is_file():
        return []  # a run that stopped before its first test (bad input): nothing recorded
    if in_use(path):
        raise BadInput(
            f"a run holds {workdir} now and uses its test images: clean up after it ends"
        )
    # The sessions' ledgers, and those of the reproductions run on them (`reproduce` layers an
    # image again when the recorded one is gone), with the sessions they backed up.
    ledgers = [*earlier_sessions(path).values(), path]
    root = workdir.resolve()
    for repro in [root / "reproductions", *sorted(root.glob("sessions/*/reproductions"))]:
        if (repro / path.name).is_file():
            ledgers += [*earlier_sessions(repro / path.name).values(), repro / path.name]
    ids: list[str] = []
    for ledger in ledgers:
        document = Ledger.read(ledger)
        ids += [a.image_id for a in document.attempts if a.image_id]
        ids += document.ahead_images
    return list(dict.fromkeys(ids))


@app.command("export")
def export_bundle(
    run_id: Annotated[
        str,
        typer.Argument(
            metavar="RUN_ID",
            help="A run id from the report or `status`, its number, or a pypto SHA.",
        ),
    ],
    to: Annotated[Path, typer.Option("--to", metavar="DIR", help="New directory for the bundle.")],
    workdir: WorkdirOpt = None,
    session: SessionOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Write a clean-room bundle of one attempt: its image, ledger entry, environment, example
    files and a run.sh that reproduces the verdict without this tool or the repositories."""
    from runner.bundle import export_attempt

    with guarded():
        bundle = export_attempt(_workdir(workdir, config), run_id, to, session, ERR.print)
    attempt = bundle.attempt
    OUT.print(f"exported {attempt.run_id} ({attempt.verdict.value} {attempt.reason}) to {to}")
    OUT.print(f"image: {bundle.image_bytes / 1e6:.1f} MB gzipped; reproduce with: {to}/run.sh")


builder_app = typer.Typer(
    help="Prepare and list builder images (the base image plus one era's build tools).",
    no_args_is_help=True,
)
app.add_typer(builder_app, name="builder")


@builder_app.command("prepare")
def builder_prepare(
    pypto: PyptoOpt = None,
    good: GoodOpt = None,
    bad: BadOpt = None,
    base_image: BaseImageOpt = None,
    wheelhouse: WheelhouseOpt = None,
    build_pin: BuildPinOpt = None,
    resolve_by_date: ResolveByDateOpt = None,
    simpler: SimplerOpt = None,
    submodule_source: SubmoduleSourceOpt = None,
    submodule_path: SubmodulePathOpt = None,
    python: PythonOpt = None,
    cache_dir: CacheOpt = None,
    config: ConfigOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the builders as JSON.")] = False,
) -> None:
    """Build every builder image a range may need, ahead of `run` (e.g. before going offline).

    Covers the endpoints, every commit that edits pyproject.toml and every simpler commit the
    range pins; takes the same build settings (flags, environment, config file) as `run`.
    """
    from runner.prepare import prepare_builders

    flags: dict[str, Any] = {
        "pypto": pypto,
        "good": good,
        "bad": bad,
        "base_image": base_image,
        "wheelhouse": wheelhouse,
        "resolve_by_date": resolve_by_date,
        "simpler": simpler,
        "submodule_path": submodule_path,
        "python": python,
        "cache_dir": cache_dir,
    }
    console = _stderr_console(quiet=json_out)
    with guarded():
        flags["submodule_sources"] = _pairs(submodule_source, "--submodule-source", "PATH=DIR")
        flags["build_pins"] = _pins(build_pin)
        settings = load_settings(flags, config)
        planned = prepare_builders(settings, echo=lambda line: console.print(line, markup=False))
    rows = [
        {
            "package": item.package,
            "commit": item.commit,
            "builder": item.builder.image_id if item.builder else None,
            "build_tools": list(item.builder.tools if item.builder else item.resolution.pins),
            "notes": list(item.resolution.notes),
        }
        for item in planned
    ]
    if json_out:
        OUT.print_json(data=rows)
        return
    # One line per builder and package: a range of months resolves to a handful of tool sets.
    groups: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        tools = " ".join(row["build_tools"])
        groups.setdefault((row["package"], row["builder"] or "", tools), []).append(row["commit"])
    for (package, builder, tools), commits in groups.items():
        which = commits[0][:12] if len(commits) == 1 else f"{len(commits)} commits"
        OUT.print(f"{package:7} {which:12}  {builder[7:19]}  {tools}", markup=False)


@builder_app.command("ls")
def builder_ls(
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Builder images in the Docker Engine, newest first."""
    from runner.builders import list_builders
    from runner.execute import connect

    with guarded():
        rows = list_builders(connect())
    if json_out:
        OUT.print_json(data=rows)
        return
    for row in rows:
        base = row["base_name"] or row["base"][7:19]
        python = f" ({row['python']})" if row["python"] != "python3" else ""
        OUT.print(
            f"{row['id'][7:19]}  {row['created'][:19]}  {base}{python}  {row['tools']}",
            markup=False,
        )


if __name__ == "__main__":  # pragma: no cover
    app()
