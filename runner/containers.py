"""The value types of a container: what to run (`ContainerSpec`, `Mount`) and how it went.

They live apart from `execute.py`, which talks to Docker, so the modules that only describe a
container (`devices.py` choosing NPU mounts, the builders and wheel builds filling in a spec)
depend on plain data, and `execute.py` can use their decisions without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Mount:
    """A bind mount; read-only unless the container must write there."""

    host: str
    container: str
    read_only: bool = True


@dataclass
class ContainerSpec:
    """Everything Docker needs for one container, with safe defaults (no network, no devices)."""

    image: str
    # The command only: CANN images source set_env.sh in their entrypoint, which must wrap it.
    command: list[str]
    environment: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)  # "host:container:rwm"
    privileged: bool = False
    ipc_mode: str | None = None
    runtime: str | None = None
    network: bool = False  # False -> network_mode="none"
    # Without a network, whether Docker still sets up its network sandbox: /etc/hosts naming
    # localhost, the host's resolv.conf, as `docker run --network none` has them, for the
    # example. Builds, layers and probes start without one (NetworkDisabled): the sandbox is
    # half the engine's CPU of a container's start and stop, and they resolve no names.
    sandbox: bool = False
    working_dir: str | None = None
    cpus: float | None = None  # the simulator hangs when CPUs are oversubscribed
    cpu_shares: int | None = None  # weight under contention (Docker's default is 1024)
    mem_limit: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    user: str | None = None
    # None keeps the image's entrypoint, which every container of the tool runs through (the
    # interpreter and environment it sets up are the ones the builds and the example use);
    # [] means none.
    entrypoint: list[str] | None = None


@dataclass(frozen=True)
class ContainerResult:
    exit_code: int | None  # None when killed by timeout
    timed_out: bool
    oom_killed: bool
    seconds: float
    log_path: Path
    output: str  # full combined stdout/stderr, also in log_path
