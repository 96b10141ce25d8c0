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


# Two eras of build configuration, as real pypto had: the old one sets `cmake.minimum-version`,
# which scikit-build-core 1.x refuses ("Use cmake.version instead of cmake.minimum-version"), so
# old commits only build with the tools of their time; the new one declares a newer backend.
_SKBUILD_OLD = """
    [build-system]
    requires = ["scikit-build-core>=0.10"]
    build-backend = "scikit_build_core.build"

    [project]
    name = "{name}"
    version = "{version}"

    [tool.scikit-build]
    cmake.minimum-version = "3.15"
    wheel.packages = ["{name}"]
    """
_SKBUILD_NEW = """
    [build-system]
    requires = ["scikit-build-core>=0.11"]
    build-backend = "scikit_build_core.build"

    [project]
    name = "{name}"
    version = "{version}"

    [tool.scikit-build]
    minimum-version = "build-system.requires"
    cmake.version = ">=3.15"
    wheel.packages = ["{name}"]
    """

# The Python binding is the same at every commit, so a neighbour's build hits ccache for it.
_C_MODULE = """
    #define PY_SSIZE_T_CLEAN
    #include <Python.h>

    double {kernel}(const double *values, Py_ssize_t n);

    static PyObject *call(PyObject *self, PyObject *arg) {{
        PyObject *seq = PySequence_Fast(arg, "expected a sequence of floats");
        if (seq == NULL) return NULL;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        double *values = PyMem_Malloc(sizeof(double) * (n ? n : 1));
        if (values == NULL) {{ Py_DECREF(seq); return PyErr_NoMemory(); }}
        for (Py_ssize_t i = 0; i < n; ++i)
            values[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(seq, i));
        Py_DECREF(seq);
        double result = {kernel}(values, n);
        PyMem_Free(values);
        if (PyErr_Occurred()) return NULL;
        return PyFloat_FromDouble(result);
    }}

    static PyMethodDef methods[] = {{
        {{"{kernel}", call, METH_O, "native {kernel}"}},
        {{NULL, NULL, 0, NULL}},
    }};
    static struct PyModuleDef module = {{PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods}};
    PyMODINIT_FUNC PyInit__native(void) {{ return PyModule_Create(&module); }}
    """


# pypto's code generation, the same in both kinds of sample: the generated source the triage reads.
_CODEGEN = textwrap.dedent(
    """
    def codegen(name):
        return (
            f"// kernel {name}\\n"
            f"float {name}(const float *x, int n) {{\\n"
            f"    float s = 0; for (int i = 0; i < n; ++i) s += x[i];\\n"
            f"    return s / n * {FACTOR!r}f;\\n"
            f"}}\\n"
        )
    """
)


COMPILE_UNIT = 200_000
"""Iterations of one compile-time loop: about half a second of one core for GCC 12 here."""


def _compile_work(revision: int, units: int) -> str:
    """C++17 that makes the compiler work `units` loops of `COMPILE_UNIT` steps: a heavy
    translation unit (real pypto's take seconds each), seeded by the revision so ccache cannot
    reuse another commit's object. Nothing of it reaches the binary."""
    if units <= 0:
        return ""
    lines = [
        "",
        "namespace compile_work {",
        "constexpr unsigned long churn(unsigned long seed, unsigned long steps) {",
        "    unsigned long x = seed;",
        "    for (unsigned long i = 0; i < steps; ++i) x = x * 6364136223846793005UL + i;",
        "    return x;",
        "}",
    ]
    lines += [
        f"static_assert(churn({revision * 1000 + unit}UL, {COMPILE_UNIT}UL) != 1);"
        for unit in range(units)
    ]
    lines.append("}  // namespace compile_work")
    return "\n".join(lines) + "\n"


def _native_package(
    root: Path, name: str, version: str, *, new_era: bool, language: str, sources: list[str]
) -> None:
    template = _SKBUILD_NEW if new_era else _SKBUILD_OLD
    _write(root / "pyproject.toml", template.format(name=name, version=version))
    languages = "C CXX" if language == "CXX" else "C"
    lines = [
        "cmake_minimum_required(VERSION 3.15)",
        f"project({name} LANGUAGES {languages})",
        *(["set(CMAKE_CXX_STANDARD 17)"] if language == "CXX" else []),
        "find_package(Python COMPONENTS Interpreter Development.Module REQUIRED)",
        f"Python_add_library(_native MODULE {' '.join(sources)} WITH_SOABI)",
        f"install(TARGETS _native DESTINATION {name})",
    ]
    (root / "CMakeLists.txt").write_text("\n".join(lines) + "\n")
    for stale in ("setup.py",):
        (root / stale).unlink(missing_ok=True)


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


def write_simpler(
    root: Path,
    *,
    revision: int,
    scale: float = 1.0,
    broken: bool = False,
    native: bool = False,
    new_era: bool = False,
    compile_work: int = 0,
    api_v2: bool = False,
    unreadable: bool = False,
    in_header: bool = False,
) -> None:
    """A simpler-like runtime: `accumulate` is the kernel whose precision may regress.

    `native`: the kernel is C, built by scikit-build-core and CMake like the real runtime;
    `compile_work` adds a C++ unit that costs that much compiling (see `_compile_work`).
    `api_v2`: the kernel is renamed `accumulate_v2` (pypto before the rename cannot import it).
    `unreadable`: a merge conflict's marker is left in pyproject.toml, which is then not TOML.
    `in_header`: `scale` goes into `include/abi.h`, a header pypto's build compiles in (see
    `write_pypto`), and the kernel itself stays exact.
    """
    if native:
        _write_native_simpler(root, revision, scale, broken, new_era, compile_work)
        return
    if in_header:
        _write(root / "include" / "abi.h", f"#define ABI_SCALE {scale!r}\n")
        scale = 1.0
    kernel = "accumulate_v2" if api_v2 else "accumulate"
    _write(root / "pyproject.toml", _pyproject("simpler", f"0.{revision}.0"))
    if unreadable:
        with (root / "pyproject.toml").open("a") as pyproject:
            pyproject.write("<<<<<<< HEAD\n")
    body = f"""
        \"\"\"simpler-like runtime, revision {revision}.\"\"\"

        REVISION = {revision}
        SCALE = {scale!r}


        def {kernel}(values):
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


def _write_native_simpler(
    root: Path, revision: int, scale: float, broken: bool, new_era: bool, compile_work: int = 0
) -> None:
    _native_package(
        root,
        "simpler",
        f"0.{revision}.0",
        new_era=new_era,
        language="CXX" if compile_work else "C",
        sources=["src/module.c", "src/kernel.c", *(["src/tuning.cpp"] if compile_work else [])],
    )
    if compile_work:
        _write(
            root / "src" / "tuning.cpp",
            f"// simpler-like runtime tuning tables, revision {revision}: C++17.\n"
            + _compile_work(revision, compile_work),
        )
    else:
        (root / "src" / "tuning.cpp").unlink(missing_ok=True)
    _write(root / "src" / "module.c", _C_MODULE.format(kernel="accumulate"))
    _write(
        root / "src" / "kernel.c",
        f"""
        /* simpler-like runtime kernel, revision {revision}. */
        #include <stddef.h>
        {"#error this revision does not compile" if broken else ""}
        #define SCALE {scale!r}

        double accumulate(const double *values, long n) {{
            double total = 0.0;
            for (long i = 0; i < n; ++i) total += values[i];
            return total * SCALE;
        }}
        """,
    )
    _write(
        root / "simpler" / "__init__.py",
        f"""
        \"\"\"simpler-like runtime, revision {revision} (native kernel).\"\"\"

        from simpler._native import accumulate

        REVISION = {revision}


        def describe():
            return "simpler r{revision}"
        """,
    )


def _write_native_pypto(
    root: Path,
    revision: int,
    factor: float,
    uses_simpler: bool,
    broken: bool,
    new_era: bool,
    compile_work: int = 0,
) -> None:
    _native_package(
        root,
        "pypto",
        f"0.{revision}.0",
        new_era=new_era,
        language="CXX",
        sources=["src/module.c", "src/codegen.cpp"],
    )
    _write(root / "src" / "module.c", _C_MODULE.format(kernel="scale_mean"))
    _write(
        root / "src" / "codegen.cpp",
        f"""
        // pypto-like code generation pass, revision {revision}: C++17.
        #include <numeric>
        #include <vector>
        {"#error no matching function for call to 'cast'" if broken else ""}
        namespace pypto {{
        constexpr double kFactor = {factor!r};
        inline double mean(const std::vector<double> &v) {{
            if (v.empty()) return 0.0;
            return std::accumulate(v.begin(), v.end(), 0.0) / v.size() * kFactor;
        }}
        }}  // namespace pypto

        extern "C" double scale_mean(const double *values, long n) {{
            // The runtime summed already: scale the mean it hands back.
            std::vector<double> one{{values[0]}};
            (void)n;
            return pypto::mean(one);
        }}
        """
        + _compile_work(revision, compile_work),
    )
    accumulate = (
        "from simpler import accumulate"
        if uses_simpler
        else "def accumulate(values):\n    return float(sum(values))"
    )
    _write(
        root / "pypto" / "__init__.py",
        f'"""pypto-like compiler, revision {revision} (native codegen)."""\n\n'
        f"{accumulate}\n"
        "from pypto._native import scale_mean\n\n"
        f"REVISION = {revision}\n"
        f"FACTOR = {factor!r}\n\n\n"
        + _CODEGEN
        + "\n\ndef mean(values):\n    return scale_mean([accumulate(values) / len(values)])\n",
    )


def write_pypto(
    root: Path,
    *,
    revision: int,
    factor: float = 1.0,
    uses_simpler: bool = True,
    broken: bool = False,
    native: bool = False,
    new_era: bool = False,
    compile_work: int = 0,
    api_v2: bool = False,
    bakes_runtime: bool = False,
) -> None:
    """A pypto-like compiler: `codegen` emits source text, `mean` runs it on the runtime.

    Before the runtime submodule existed (`uses_simpler=False`) pypto summed on its own.
    `native`: part of it is C++17, built by scikit-build-core and CMake like the real compiler;
    `compile_work` makes its code generation unit cost that much compiling (`_compile_work`).
    `api_v2`: it imports simpler's kernel by its new name (see `write_simpler`).
    `bakes_runtime`: its build reads `runtime/include/abi.h` from the runtime submodule and bakes
    it into the wheel, as real pypto's CMake compiles in the runtime's headers.
    """
    if native:
        _write_native_pypto(root, revision, factor, uses_simpler, broken, new_era, compile_work)
        return
    _write(root / "pyproject.toml", _pyproject("pypto", f"0.{revision}.0"))
    if uses_simpler:
        # (after simpler's rename, `api_v2`, the new name under the old)
        accumulate = f"from simpler import accumulate{'_v2 as accumulate' if api_v2 else ''}"
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
        + _CODEGEN
        + "\n\ndef mean(values):\n    return accumulate(values) / len(values) * FACTOR"
        + (" * _abi.ABI_SCALE\n" if bakes_runtime else "\n")
    )
    if bakes_runtime:
        body = body.replace(
            f"REVISION = {revision}\n", f"from pypto import _abi\n\nREVISION = {revision}\n"
        )
    if broken:
        _break_build(root)
    elif bakes_runtime:
        _write(root / "setup.py", _BAKE_ABI)
    else:
        _unbreak_build(root)
    _write(root / "pypto" / "__init__.py", body)
    _write(root / "src" / "README", f"native sources of revision {revision}\n")


_BAKE_ABI = """
    \"\"\"Bakes the runtime's ABI header into the package, as a C++ build compiles it in.\"\"\"
    import re
    from pathlib import Path

    from setuptools import setup
    from setuptools.command.build_py import build_py


    class BakeAbi(build_py):
        def run(self):
            super().run()
            header = Path("runtime/include/abi.h").read_text()
            scale = re.search(r"#define ABI_SCALE (\\S+)", header).group(1)
            target = Path(self.build_lib) / "pypto" / "_abi.py"
            target.write_text(f"ABI_SCALE = {scale}\\n")


    setup(cmdclass={"build_py": BakeAbi})
    """


# Where the example waits for the card when a sample models NPU time (see write_lib).
_DEVICE_WAIT = "            # device-wait\n"


def write_lib(root: Path, *, example_seconds: float = 0.0) -> None:
    """A pypto-lib-like checkout with one example, run as `python <script> -p <platform> -d <n>`.

    `example_seconds`: the run waits that long after code generation, as a real example waits for
    the NPU: the card is busy, the host's CPUs stay free (for a neighbouring build, say). A sleep,
    not a busy loop, so a benchmark on a small machine measures what an NPU host would see.
    """
    _write(root / "README.md", "# sample pypto-lib\n")
    _write(root / "models" / "__init__.py", "")
    _write(root / "models" / "sample" / "__init__.py", "")
    wait = f"            time.sleep({example_seconds!r})\n" if example_seconds > 0 else ""
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
            and a bad run a pass; SAMPLE_FLAKE_SEED seeds the draws. Each attempt of a session draws
            anew, from the seed and its run folder's number, so a session with one device lies the
            same way each time it is made (the test suite relies on that). Where the output folder
            has no number (a clean-room bundle), the clock is mixed in instead.
            """
            false_fail = float(os.environ.get("SAMPLE_FALSE_FAIL") or 0)
            false_pass = float(os.environ.get("SAMPLE_FALSE_PASS") or 0)
            if not (false_fail or false_pass):
                return None
            seed = os.environ.get("SAMPLE_FLAKE_SEED", "0")
            attempt = run_number()
            if attempt is None:
                attempt = f"{time.time_ns()}:{os.getpid()}"
            draw = random.Random(f"{seed}:{attempt}").random()
            return draw, false_fail, false_pass


        def run_number():
            """The number of the run folder (`NNN-...`) mounted where the output goes, or None.

            The folder's host path is the mount's root in /proc/self/mountinfo."""
            output = os.path.dirname(os.environ.get("PYPTO_PROG_BUILD_DIR", "").rstrip("/"))
            try:
                lines = Path("/proc/self/mountinfo").read_text().splitlines()
            except OSError:
                return None
            for line in lines:
                fields = line.split()
                if len(fields) > 4 and output and fields[4] == output:
                    number = fields[3].rstrip("/").rsplit("/", 1)[-1].split("-", 1)[0]
                    return int(number) if number.isdigit() else None
            return None


        def simpler_revision():
            try:
                import simpler
            except ImportError:  # (a pypto from before the runtime)
                return None
            return getattr(simpler, "REVISION", None)


        def host_drifted():
            """SAMPLE_HOST_STATE names a host file (mounted, e.g. under --ptoas-root); once it says
            "drifted" every comparison fails, as goldens do when the host's BLAS changes."""
            path = os.environ.get("SAMPLE_HOST_STATE")
            return bool(path) and os.path.isfile(path) and "drifted" in Path(path).read_text()


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
            # SAMPLE_SAYS_FIRST: a line the example prints before it computes (a driver's error
            # that an example goes on after, say).
            if os.environ.get("SAMPLE_SAYS_FIRST"):
                print(os.environ["SAMPLE_SAYS_FIRST"], flush=True)
            # SAMPLE_HANG_AT_SIMPLER: simpler revisions (comma-separated) with which the example
            # never ends (a state inside a bump that --timeout stops).
            hang = os.environ.get("SAMPLE_HANG_AT_SIMPLER")
            if hang and simpler_revision() in {int(n) for n in hang.split(",")}:
                time.sleep(3600)
            # SAMPLE_RUN_SECONDS: how long the example computes (a run a test can interrupt).
            time.sleep(float(os.environ.get("SAMPLE_RUN_SECONDS") or 0))
            # SAMPLE_HOLD_MIB: memory the example holds while it computes (an OOM kill a test can
            # cause under --memory).
            held = [bytearray(1 << 20) for _ in range(int(os.environ.get("SAMPLE_HOLD_MIB") or 0))]
            emit_generated_code("DecodeFwd")
            # device-wait
            out = pypto.mean(VALUES)
            del held
            diff = abs(out - GOLDEN)
            tol = ATOL + RTOL * abs(GOLDEN)
            passed = diff <= tol and not host_drifted()
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
            # SAMPLE_HOLD_AFTER_MIB: memory a failing run takes after it printed the mismatch
            # (killed under --memory after the figures are out).
            after = int(os.environ.get("SAMPLE_HOLD_AFTER_MIB") or 0)
            held = [bytearray(1 << 20) for _ in range(after)]
            del held
            return 1


        if __name__ == "__main__":
            sys.exit(main())
        '''.replace(_DEVICE_WAIT, wait),
    )
