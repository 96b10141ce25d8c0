"""File contents of the sample packages. Each writer fills a directory; git history is elsewhere.

The sample example computes the mean of a fixed vector through pypto (the "compiler") and simpler
(the "runtime") and compares it with a golden value the way pypto-lib examples do. A regression is
a scale factor that drifts away from 1.0 in either package.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

EXAMPLE_PATH = "models/sample/decode_fwd.py"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())


def _pyproject(name: str, version: str) -> str:
    return f"""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{name}"
        version = "{version}"

        [tool.setuptools]
        packages = ["{name}"]
        """


def _break_build(root: Path) -> None:
    """Make the wheel build fail the way a C++ compile error does: setup.py exits non-zero."""
    _write(
        root / "setup.py",
        """
        import sys

        sys.exit("src/codegen.cpp:42:7: error: no matching function for call to 'cast'")
        """,
    )


def _unbreak_build(root: Path) -> None:
    (root / "setup.py").unlink(missing_ok=True)


def write_simpler(root: Path, *, revision: int, scale: float = 1.0, broken: bool = False) -> None:
    """A simpler-like runtime: `accumulate` is the kernel whose precision may regress."""
    _write(root / "pyproject.toml", _pyproject("simpler", f"0.{revision}.0"))
    body = f"""
        \"\"\"simpler-like runtime, revision {revision}.\"\"\"

        REVISION = {revision}
        SCALE = {scale!r}


        def accumulate(values):
            total = 0.0
            for value in values:
                total += value
            return total * SCALE


        def describe():
            return "simpler r{revision}"
        """
    if broken:
        _break_build(root)
    else:
        _unbreak_build(root)
    _write(root / "simpler" / "__init__.py", body)


def write_pypto(
    root: Path,
    *,
    revision: int,
    factor: float = 1.0,
    uses_simpler: bool = True,
    broken: bool = False,
) -> None:
    """A pypto-like compiler: `codegen` emits source text, `mean` runs it on the runtime.

    Before the runtime submodule existed (`uses_simpler=False`) pypto summed on its own.
    """
    _write(root / "pyproject.toml", _pyproject("pypto", f"0.{revision}.0"))
    if uses_simpler:
        accumulate = "from simpler import accumulate"
    else:
        accumulate = textwrap.dedent(
            """
            def accumulate(values):
                total = 0.0
                for value in values:
                    total += value
                return total
            """
        )
    body = (
        f'"""pypto-like compiler, revision {revision}."""\n\n'
        f"{accumulate}\n\n"
        f"REVISION = {revision}\n"
        f"FACTOR = {factor!r}\n\n\n"
        + textwrap.dedent(
            """
            def codegen(name):
                return (
                    f"// kernel {name}\\n"
                    f"float {name}(const float *x, int n) {{\\n"
                    f"    float s = 0; for (int i = 0; i < n; ++i) s += x[i];\\n"
                    f"    return s / n * {FACTOR!r}f;\\n"
                    f"}}\\n"
                )


            def mean(values):
                return accumulate(values) / len(values) * FACTOR
            """
        )
    )
    if broken:
        _break_build(root)
    else:
        _unbreak_build(root)
    _write(root / "pypto" / "__init__.py", body)
    _write(root / "src" / "README", f"native sources of revision {revision}\n")


def write_lib(root: Path) -> None:
    """A pypto-lib-like checkout with one example, run as `python <script> -p <platform> -d <n>`."""
    _write(root / "README.md", "# sample pypto-lib\n")
    _write(root / "models" / "__init__.py", "")
    _write(root / "models" / "sample" / "__init__.py", "")
    _write(
        root / EXAMPLE_PATH,
        '''
        """Sample decode step: mean of a vector, checked against a golden value."""

        import argparse
        import os
        import random
        import stat
        import sys
        import time
        from pathlib import Path

        import pypto

        VALUES = [0.5, 1.25, 2.0, 3.75, 4.5, 5.0, 6.25, 7.75]
        GOLDEN = sum(VALUES) / len(VALUES)
        RTOL = 1e-5
        ATOL = 1e-6


        def flake():
            """Make the golden comparison lie now and then, as it does on hardware.

            SAMPLE_FALSE_FAIL / SAMPLE_FALSE_PASS are the chances that a good run reports a mismatch
            and a bad run a pass; SAMPLE_FLAKE_SEED seeds the draws (mixed with the clock, so every
            run draws anew while two experiments with other seeds differ).
            """
            false_fail = float(os.environ.get("SAMPLE_FALSE_FAIL") or 0)
            false_pass = float(os.environ.get("SAMPLE_FALSE_PASS") or 0)
            if not (false_fail or false_pass):
                return None
            seed = os.environ.get("SAMPLE_FLAKE_SEED", "0")
            draw = random.Random(f"{seed}:{time.time_ns()}:{os.getpid()}").random()
            return draw, false_fail, false_pass


        def emit_generated_code(name):
            base = Path(os.environ.get("PYPTO_PROG_BUILD_DIR", "build_output"))
            out = base / f"{name}_{time.strftime('%Y%m%d_%H%M%S')}"
            (out / "kernels" / "aiv").mkdir(parents=True, exist_ok=True)
            (out / "ptoas").mkdir(parents=True, exist_ok=True)
            (out / "orchestration").mkdir(parents=True, exist_ok=True)
            code = pypto.codegen(name)
            (out / "kernels" / "aiv" / f"{name}.cpp").write_text(code)
            (out / "ptoas" / f"{name}.pto").write_text("; pto\\n" + code)
            (out / "orchestration" / "orch.cpp").write_text(f"// orchestrate {name}\\n")
            (out / "kernels" / "aiv" / f"{name}.o").write_bytes(str(time.time()).encode())
            (out / "kernel_config.py").write_text(f"BUILT_AT = {time.time()!r}\\n")


        def check_device(platform, device):
            if platform.endswith("sim"):
                return
            node = f"/dev/davinci{device}"
            try:
                mode = os.stat(node).st_mode
            except FileNotFoundError:
                print(f"[ERROR] aclInit failed: {node} not found", flush=True)
                sys.exit(3)
            if not stat.S_ISCHR(mode):
                print(f"[ERROR] aclInit failed: {node} is not a character device", flush=True)
                sys.exit(3)
            print(f"[RUN] device {node} is a character device", flush=True)


        def main():
            parser = argparse.ArgumentParser()
            parser.add_argument("-p", "--platform", default="a2a3sim")
            parser.add_argument("-d", "--device", default="0")
            args = parser.parse_args()
            started = time.time()
            check_device(args.platform, args.device)
            emit_generated_code("DecodeFwd")
            out = pypto.mean(VALUES)
            diff = abs(out - GOLDEN)
            tol = ATOL + RTOL * abs(GOLDEN)
            passed = diff <= tol
            lie = flake()
            if lie is not None:
                draw, false_fail, false_pass = lie
                if passed and draw < false_fail:
                    passed, diff = False, tol * 3
                elif not passed and draw < false_pass:
                    passed = True
            if passed:
                print("[RUN]   'out' PASS  shape=(1,) dtype=float32", flush=True)
                print(f"[RUN] PASS ({time.time() - started:.2f}s)", flush=True)
                return 0
            print("[RUN]   'out' FAIL  shape=(1,) dtype=float32 (allclose)", flush=True)
            print("Error: Output(s) does not match golden: ['out']", flush=True)
            print(f"Mismatched elements: 1/1  rtol={RTOL} atol={ATOL}", flush=True)
            print(f"max abs diff={diff:.6g} at (0,) (tol={tol:.6g})", flush=True)
            return 1


        if __name__ == "__main__":
            sys.exit(main())
        ''',
    )
