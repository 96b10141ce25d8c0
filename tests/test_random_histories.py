"""Random two-level histories bisected by the real command line: exports, builds, test images
and runs in Docker, on one lane or two, against the brute-force answer.

The session tests draw the same histories with a tester that answers from the spec; this one
checks that everything between the search and the example keeps its answer. The suite runs a
few fixed examples; `make fuzz` draws new ones (HYPOTHESIS_PROFILE=explore, FUZZ_EXAMPLES)
and shrinks a failing history to a small one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from runner.sample.demo import on_simulator
from runner.sample.histories import SampleSpec, make_sample
from tests.fixtures.cli import cli, run_args
from tests.fixtures.histories import expected_outcome, monotone, sample_specs

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES") or 3)


@pytest.mark.docker
@pytest.mark.e2e
@pytest.mark.timeout(300 * EXAMPLES)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    spec=sample_specs(pypto=(5, 16), simpler=(3, 14), header=True),
    lanes=st.sampled_from(["0", "0,1"]),
)
def test_a_random_history_run_from_the_command_line_names_the_brute_force_culprit(
    spec: SampleSpec, lanes: str, shared_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    assume(monotone(spec))
    root = tmp_path_factory.mktemp("random")
    sample = make_sample(root / "repos", spec)
    workdir = root / "work"
    # The checkout holds only the nested pins its HEAD needs; the sample's upstreams serve the
    # rest, as a user's clones would.
    sources = [
        f"--submodule-source=runtime/third_party/isa={sample.mirrors['isa']}",
        f"--submodule-source=3rdparty/libbacktrace={sample.mirrors['libbacktrace']}",
    ]
    args = on_simulator(run_args(sample, workdir, shared_cache), lanes)

    result = cli(*args, *sources, "--json")

    assert result.returncode == 0, f"{spec}\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr
    report = result.json()
    source, culprit, state = expected_outcome(spec)
    assert report["pypto"]["first_bad"] == sample.pypto_shas[culprit], spec
    assert report["source"] == source, spec
    if state is not None:
        assert report["simpler"]["first_bad"] == sample.simpler_shas[state], spec
    attempts = json.loads((workdir / "ledger.json").read_text())["attempts"]
    assert {a["device"] for a in attempts if a["device"]} <= set(lanes.split(","))
