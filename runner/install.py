"""How a wheel becomes a layer: a small installer run in the layering container, pip as fallback.

A test image is the base image plus the commit's wheels, one committed layer each (see
`runner.images`). `pip install` of one small wheel spends ~0.45 s of CPU on its own start-up
(against ~0.1 s for this), and a bisect layers an image per tested pair, so the container runs
`WHEEL_INSTALLER` instead: the wheel spec's install steps for the wheels this tool builds
itself, into the interpreter's default scheme, where pip would put them. Whatever it does not
handle (headers, an unreadable wheel, a distribution the image already has, which pip would
uninstall first, a Python before 3.8, a default scheme off the interpreter's path) or fails at,
it hands to pip with exit code 3: pip then installs over anything written, so the installer
alone never makes a commit untestable.
"""

from __future__ import annotations

import shlex

FALLBACK_EXIT = 3

# The script's one parameter, its hand-over code, is put in front of its text: the text has
# braces of its own, so it is no format string.
WHEEL_INSTALLER = (
    f"import os, sys\n\nFALLBACK = {FALLBACK_EXIT}\n"
    + """

def python_allowed(requires):
    # The clauses pip refuses a wheel for, on release numbers ("3.9", "3.*"); anything else is
    # left to pip, which has the whole specifier grammar.
    if not requires:
        return True
    here = sys.version_info[:3]
    for clause in requires.split(","):
        clause = clause.strip()
        op = next((o for o in ("~=", "==", "!=", ">=", "<=", ">", "<") if clause.startswith(o)), "")
        text = clause[len(op):].strip()
        star = text.endswith(".*")
        parts = text[:-2].split(".") if star else text.split(".")
        if not op or not all(p.isdigit() for p in parts) or (star and op not in ("==", "!=")):
            return False
        want = tuple(int(p) for p in parts)
        if op == "~=":
            ok = len(want) > 1 and here >= want and here[: len(want) - 1] == want[:-1]
        elif op in ("==", "!="):  # 3.11 is 3.11.0; 3.11.* any 3.11
            same = here[: len(want)] == want if star else here == (want + (0, 0))[:3]
            ok = same == (op == "==")
        else:
            ok = {">=": here >= want, "<=": here <= want, ">": here > want, "<": here < want}[op]
        if not ok:
            return False
    return True


def tag_allowed(tag):
    # Interpreter and platform of one "py3-none-any" / "cp311-cp311-linux_x86_64" tag: a wheel
    # for another Python or machine goes to pip, which refuses it.
    import platform
    interpreters, _abis, platforms = tag.strip().split("-")
    major, minor = sys.version_info[:2]
    ours = {"py3", f"py{major}", f"py{major}{minor}"}
    if sys.implementation.name == "cpython":
        ours.add(f"cp{major}{minor}")
    if not ours & set(interpreters.split(".")):
        return False
    machine = platform.machine()
    return any(p == "any" or (p.startswith(("linux_", "manylinux")) and p.endswith(machine))
               for p in platforms.split("."))


def install(wheel):
    import base64, compileall, csv, email.parser, hashlib, importlib.util, site, sysconfig
    import zipfile
    import importlib.metadata as metadata  # Python 3.8 and later; pip before that

    archive = zipfile.ZipFile(wheel)
    names = archive.namelist()
    infos = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")}
    (info,) = infos
    parse = email.parser.Parser().parsestr
    spec = parse(archive.read(info + "/WHEEL").decode())
    meta = parse(archive.read(info + "/METADATA").decode())
    name = meta["Name"]
    if spec.get("Wheel-Version", "").split(".")[0] != "1" or not name:
        raise ValueError("not a version 1 wheel")
    if not python_allowed(meta.get("Requires-Python")):
        raise ValueError("Requires-Python excludes this Python, or is not understood here")
    if not any(tag_allowed(tag) for tag in spec.get_all("Tag") or []):
        raise ValueError("no tag of the wheel is this interpreter's")
    data = info[: -len(".dist-info")] + ".data/"
    if any(n.startswith(data) and not n.endswith("/") and n[len(data):].split("/")[0] not in
           ("purelib", "platlib", "scripts", "data") for n in names):
        raise ValueError("headers or an unknown .data directory")
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        pass
    else:
        raise ValueError(f"{name} is installed already: pip replaces it")

    paths = sysconfig.get_paths()
    # Debian's and Ubuntu's Pythons before 3.10 patched distutils, which pip uses there, not
    # sysconfig: its purelib, /usr/lib/python3.9/site-packages, is on no path (and its scripts
    # and data are the distribution's /usr/bin and /usr, where pip writes /usr/local's). Only a
    # scheme the interpreter imports from is written: its sys.path, or a site directory not
    # made yet (pip removes an emptied one), which `site` puts there once it is. Scripts and
    # data, which no path can vouch for, are that scheme's.
    searched = {os.path.realpath(p) for p in sys.path if p not in ("", os.getcwd())}
    searched.update(os.path.realpath(p) for p in site.getsitepackages() if not os.path.isdir(p))
    for key in ("purelib", "platlib"):
        if os.path.realpath(paths[key]) not in searched:
            raise ValueError(f"sysconfig's {key} {paths[key]} is not on sys.path")
    pure = spec.get("Root-Is-Purelib", "").strip().lower() == "true"
    root = paths["purelib"] if pure else paths["platlib"]
    libraries = (paths["purelib"], paths["platlib"])
    record, sources = [], []

    def digest(hashed):
        return "sha256=" + base64.urlsafe_b64encode(hashed.digest()).rstrip(b"=").decode()

    def write(path, chunks, executable):
        # Streamed and hashed as it goes: a native module may be hundreds of MB. A member
        # whose CRC does not match raises on the way, and pip decides.
        os.makedirs(os.path.dirname(path), exist_ok=True)
        hashed, size = hashlib.sha256(), 0
        with open(path, "wb") as handle:
            for chunk in chunks:
                hashed.update(chunk)
                handle.write(chunk)
                size += len(chunk)
        os.chmod(path, 0o755 if executable else 0o644)
        record.append((os.path.relpath(path, root), digest(hashed), str(size)))
        if path.endswith(".py") and path.startswith(libraries):
            sources.append(path)

    def read(member):
        with archive.open(member) as stream:
            yield from iter(lambda: stream.read(1 << 20), b"")

    skipped = {info + "/RECORD", info + "/RECORD.jws", info + "/RECORD.p7s"}
    for member in archive.infolist():
        if member.is_dir() or member.filename in skipped:
            continue
        executable = bool((member.external_attr >> 16) & 0o111)
        target = member.filename
        if target.startswith(data):
            key, _, rest = target[len(data):].partition("/")
            chunks = read(member)
            if key == "scripts":
                blob = archive.read(member)
                if blob.startswith(b"#!python"):
                    blob = b"#!" + sys.executable.encode() + blob[len(b"#!python"):]
                chunks, executable = [blob], True
            write(os.path.join(paths[key], rest), chunks, executable)
        else:
            write(os.path.join(root, target), read(member), executable)

    entry = info + "/entry_points.txt"
    if entry in names:
        import configparser
        points = configparser.ConfigParser(delimiters="=", interpolation=None)
        points.optionxform = str
        points.read_string(archive.read(entry).decode())
        for group in ("console_scripts", "gui_scripts"):
            if not points.has_section(group):
                continue
            for script, target in points.items(group):
                module, _, attribute = target.partition(":")
                attribute = attribute.split("[")[0].strip()
                text = (
                    f"#!{sys.executable}\\n# -*- coding: utf-8 -*-\\nimport re\\nimport sys\\n"
                    f"from {module.strip()} import {attribute.split('.')[0]}\\n"
                    "if __name__ == '__main__':\\n"
                    "    sys.argv[0] = re.sub(r'(-script\\\\.pyw|\\\\.exe)?$', '', sys.argv[0])\\n"
                    f"    sys.exit({attribute}())\\n"
                )
                write(os.path.join(paths["scripts"], script), [text.encode()], True)

    write(os.path.join(root, info, "INSTALLER"), [b"bisect-precision-docker\\n"], False)
    for source in sources:
        if compileall.compile_file(source, quiet=2):
            compiled = importlib.util.cache_from_source(source)
            with open(compiled, "rb") as handle:
                blob = handle.read()
            record.append(
                (os.path.relpath(compiled, root), digest(hashlib.sha256(blob)), str(len(blob)))
            )
    with open(os.path.join(root, info, "RECORD"), "w", newline="") as handle:
        rows = csv.writer(handle, lineterminator="\\n")
        rows.writerows(record)
        rows.writerow((os.path.join(info, "RECORD"), "", ""))
    return name, root


wheel = sys.argv[1]
try:
    name, root = install(wheel)
except Exception as exc:  # pip decides: it writes over anything written here
    print(f"handing {os.path.basename(wheel)} to pip: {exc}", flush=True)
    sys.exit(FALLBACK)
print(f"installed {name} from {os.path.basename(wheel)} into {root}", flush=True)
"""
)


SHADOWED_EXIT = 5
SHADOWED = "BISECT-SHADOWED"

# Whether the interpreter now imports the wheel's own top-level modules: an image with its own
# copy of pypto or simpler on its path (installed by apt, an editable install, PYTHONPATH) would
# have the example run that copy whatever the commit, and every verdict would be the same.
SHADOW_CHECK = (
    f"import os, sys\n\nSHADOWED_EXIT = {SHADOWED_EXIT}\nSHADOWED = {SHADOWED!r}\n"
    + """
import importlib.util, zipfile, zlib

sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]  # the example's cwd is not this
archive = zipfile.ZipFile(sys.argv[1])
members = {info.filename: info for info in archive.infolist()}
tops = {}
for name in members:
    first = name.split("/", 1)[0]
    if first.endswith((".dist-info", ".data")):
        continue
    if "/" in name:
        if first + "/__init__.py" in members:  # (a namespace package has no file to compare)
            tops[first] = first + "/__init__.py"
    elif name.endswith(".py"):
        tops[name[:-3]] = name
    elif name.endswith(".so"):
        tops[name.split(".")[0]] = name
for top, member in sorted(tops.items()):
    try:
        spec = importlib.util.find_spec(top)
    except Exception:
        spec = None
    origin = getattr(spec, "origin", None)
    if not origin or not os.path.isfile(origin):
        print(f"{SHADOWED} {top} -", flush=True)
        sys.exit(SHADOWED_EXIT)
    crc = 0
    with open(origin, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            crc = zlib.crc32(chunk, crc)
    if os.path.getsize(origin) != members[member].file_size or crc != members[member].CRC:
        print(f"{SHADOWED} {top} {origin}", flush=True)
        sys.exit(SHADOWED_EXIT)
"""
)


def install_command(pip: str, wheel: str, python: str = "python3") -> str:
    """The layering container's shell command: the installer, or pip where it hands over (over
    a distribution the image has: pip's own uninstall first, its files left where pip cannot
    remove them), then `SHADOW_CHECK`."""
    quoted = shlex.quote(wheel)
    pip_install = f"{pip} install --no-index --no-deps --no-cache-dir"
    return (
        f"{python} -c {shlex.quote(WHEEL_INSTALLER)} {quoted}; status=$?; "
        f'if [ "$status" -eq {FALLBACK_EXIT} ]; then '
        f"{pip_install} --force-reinstall {quoted} || "
        f"{pip_install} --ignore-installed {quoted} || exit $?; "
        'elif [ "$status" -ne 0 ]; then exit "$status"; fi; '
        f"{python} -c {shlex.quote(SHADOW_CHECK)} {quoted}"
    )
