"""ferry's PEP 517 build backend: CMake builds the Python module and the `ferry` CLI, this writes
the wheel (SPDX-License-Identifier: Apache-2.0).

In-tree (pyproject.toml's backend-path) and standard library only, so that
``pip install --no-build-isolation .`` works offline on Debian 12, which packages none of
scikit-build-core, scikit-build or meson-python.

build_wheel configures a build tree for the Python that runs pip (Release, no tests or
benchmarks), builds the targets ``_ferry`` and ``ferry``, installs the CMake components
``python`` and ``cli`` into a staging folder and zips them: the package ``ferry/`` at the
wheel's root, the CLI binary in ``ferry-<v>.data/scripts/`` (pip puts it in the environment's
bin/, beside python). The build tree is kept, so a second install rebuilds only what changed;
with ccache (found by ferry's CMakeLists) a new tree compiles mostly from the cache.

Settings, from the environment or ``pip install --config-settings KEY=VALUE``:
  FERRY_BUILD_DIR / build-dir     the build tree (default: build/pip-<wheel tag>-<hash> in the
                                  source tree, one for each interpreter)
  FERRY_CMAKE_ARGS / cmake-args   more arguments for CMake's configure step (shell words), e.g.
                                  "-DFERRY_WITH_CUDA=OFF"
  CMAKE_BUILD_PARALLEL_LEVEL      parallel jobs (CMake's own variable)
"""

import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)


# ---------------------------------------------------------------------------------------------
# Metadata: pyproject.toml's [project] table, the version from CMakeLists.txt's project().


def _project_table():
    path = os.path.join(ROOT, "pyproject.toml")
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        try:
            import tomli as tomllib
        except ImportError:
            tomllib = None
    if tomllib is not None:
        with open(path, "rb") as f:
            return tomllib.load(f).get("project", {})
    return _parse_project_table(path)


def _parse_project_table(path):
    """The [project] table's simple entries (strings, string lists, inline {text = ...}),
    enough for ferry's pyproject.toml on a Python without tomllib."""
    table, inside, text = {}, False, open(path, encoding="utf-8").read()
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("["):
            inside = line == "[project]"
            continue
        m = re.match(r'^([A-Za-z0-9_-]+)\s*=\s*(.+)$', line)
        if not inside or not m:
            continue
        key, value = m.group(1), m.group(2)
        if value.startswith('"'):
            table[key] = value.strip('"')
        elif value.startswith("["):
            table[key] = re.findall(r'"([^"]*)"', value)
        elif value.startswith("{"):
            inner = re.search(r'text\s*=\s*"([^"]*)"', value)
            if inner:
                table[key] = {"text": inner.group(1)}
    # Multi-line lists (classifiers) on the lines after `key = [`.
    for m in re.finditer(r'^([A-Za-z0-9_-]+)\s*=\s*\[\s*\n(.*?)\]', text, re.M | re.S):
        table[m.group(1)] = re.findall(r'"([^"]*)"', m.group(2))
    return table


def _version():
    with open(os.path.join(ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*ferry\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise RuntimeError("ferry: no project(ferry VERSION ...) in CMakeLists.txt")
    return m.group(1)


def _metadata():
    p = _project_table()
    name = p.get("name", "ferry")
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + _version()]
    if p.get("description"):
        lines.append("Summary: " + p["description"])
    lic = p.get("license")
    if isinstance(lic, dict) and lic.get("text"):
        lines.append("License: " + lic["text"])
    elif isinstance(lic, str):
        lines.append("License: " + lic)
    if p.get("requires-python"):
        lines.append("Requires-Python: " + p["requires-python"])
    for c in p.get("classifiers", []):
        lines.append("Classifier: " + c)
    for label, url in (p.get("urls") or {}).items():
        lines.append("Project-URL: %s, %s" % (label, url))
    for dep in p.get("dependencies", []):
        lines.append("Requires-Dist: " + dep)
    body = ""
    readme = p.get("readme")
    if isinstance(readme, str) and os.path.exists(os.path.join(ROOT, readme)):
        lines.append("Description-Content-Type: text/markdown")
        with open(os.path.join(ROOT, readme), encoding="utf-8") as f:
            body = f.read()
    return name, "\n".join(lines) + "\n\n" + body


def _dist_info_name():
    name, _ = _metadata()
    return "%s-%s.dist-info" % (re.sub(r"[-_.]+", "_", name), _version())


def _wheel_tag():
    """cp311-cp311-linux_x86_64 for the interpreter running pip: the module is built for it."""
    ver = "%d%d" % sys.version_info[:2]
    if sys.implementation.name == "cpython":
        interp, abi = "cp" + ver, "cp" + ver + getattr(sys, "abiflags", "")
    else:
        interp = sys.implementation.name[:2] + ver
        abi = re.sub(r"[-.]", "_", sysconfig.get_config_var("SOABI") or "none")
    plat = re.sub(r"[-.]", "_", sysconfig.get_platform())
    return "%s-%s-%s" % (interp, abi, plat)


def _write_dist_info(directory):
    """dist-info files except RECORD, as {relative path: bytes}."""
    _, metadata = _metadata()
    di = _dist_info_name()
    files = {
        di + "/METADATA": metadata.encode("utf-8"),
        di + "/WHEEL": ("Wheel-Version: 1.0\nGenerator: ferry_build %s\nRoot-Is-Purelib: false\n"
                        "Tag: %s\n" % (_version(), _wheel_tag())).encode(),
        di + "/top_level.txt": b"ferry\n",
    }
    with open(os.path.join(ROOT, "LICENSE"), "rb") as f:
        files[di + "/LICENSE"] = f.read()
    if directory is not None:
        for rel, data in files.items():
            os.makedirs(os.path.join(directory, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(directory, rel), "wb") as f:
                f.write(data)
    return files


# ---------------------------------------------------------------------------------------------
# The CMake build.


def _setting(config_settings, key, env):
    value = (config_settings or {}).get(key)
    return value if value is not None else os.environ.get(env)


def _run(cmd):
    print("ferry_build: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def _build_and_stage(config_settings, stage):
    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("ferry: building the wheel needs cmake (Debian: apt-get install cmake)")
    python = os.path.realpath(sys.executable)
    build_dir = _setting(config_settings, "build-dir", "FERRY_BUILD_DIR")
    if not build_dir:
        key = hashlib.sha256(python.encode()).hexdigest()[:8]
        build_dir = os.path.join(ROOT, "build", "pip-%s-%s" % (_wheel_tag(), key))
    build_dir = os.path.abspath(build_dir)
    configure = [cmake, "-S", ROOT, "-B", build_dir]
    if not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")) and shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    configure += [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DPython3_EXECUTABLE=" + python,
        "-DFERRY_WITH_PYTHON=ON", "-DFERRY_WITH_TESTS=OFF", "-DFERRY_WITH_BENCH=OFF",
        "-DFERRY_WITH_FUZZ=OFF",
        "-DFERRY_INSTALL_PYTHONDIR=site",
    ]
    extra = _setting(config_settings, "cmake-args", "FERRY_CMAKE_ARGS")
    if isinstance(extra, list):
        configure += extra
    elif extra:
        configure += shlex.split(extra)
    _run(configure)
    _run([cmake, "--build", build_dir, "--target", "_ferry", "ferry"])
    for component in ("python", "cli"):
        _run([cmake, "--install", build_dir, "--prefix", stage, "--component", component, "--strip"])


def _wheel_files(stage):
    """{path in the wheel: (source file, mode)} from the staging folder."""
    files = {}
    package = os.path.join(stage, "site", "ferry")
    for dirpath, _, names in os.walk(package):
        for n in sorted(names):
            src = os.path.join(dirpath, n)
            rel = os.path.relpath(src, os.path.join(stage, "site")).replace(os.sep, "/")
            files[rel] = (src, 0o644)
    if not any(re.match(r"ferry/_ferry\..*(so|pyd)$", p) for p in files):
        raise RuntimeError("ferry: the build installed no ferry/_ferry module under " + package)
    # The module's type stubs and the PEP 561 marker: a wheel without them types as Any.
    for typed in ("ferry/_ferry.pyi", "ferry/py.typed"):
        if typed not in files:
            raise RuntimeError("ferry: the build installed no %s under %s" % (typed, package))
    cli = os.path.join(stage, "bin", "ferry")
    if not os.path.exists(cli):
        raise RuntimeError("ferry: the build installed no CLI at " + cli)
    data = "%s-%s.data" % ("ferry", _version())
    files[data + "/scripts/ferry"] = (cli, 0o755)
    return files


def _record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return "%s,sha256=%s,%d" % (path, digest, len(data))


def _zip_add(zf, path, data, mode):
    info = zipfile.ZipInfo(path, date_time=_ZIP_TIME)
    info.external_attr = (0o100000 | mode) << 16  # a regular file and its permissions
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, data)


# ---------------------------------------------------------------------------------------------
# PEP 517 hooks.


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _write_dist_info(metadata_directory)
    return _dist_info_name()


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel_name = "%s-%s-%s.whl" % ("ferry", _version(), _wheel_tag())
    with tempfile.TemporaryDirectory(prefix="ferry-wheel-") as stage:
        _build_and_stage(config_settings, stage)
        records = []
        os.makedirs(wheel_directory, exist_ok=True)
        out = os.path.join(wheel_directory, wheel_name)
        with zipfile.ZipFile(out, "w") as zf:
            for path, (src, mode) in sorted(_wheel_files(stage).items()):
                with open(src, "rb") as f:
                    data = f.read()
                _zip_add(zf, path, data, mode)
                records.append(_record_line(path, data))
            for path, data in sorted(_write_dist_info(None).items()):
                _zip_add(zf, path, data, 0o644)
                records.append(_record_line(path, data))
            record = _dist_info_name() + "/RECORD"
            records.append(record + ",,")
            _zip_add(zf, record, ("\n".join(records) + "\n").encode(), 0o644)
    return wheel_name


def _sdist_files():
    """The tracked files (git ls-files), or every file but build trees and caches."""
    try:
        out = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], check=True,
                             capture_output=True).stdout
        names = [n for n in out.decode().split("\0") if n]
        if names:
            return [n for n in names if os.path.isfile(os.path.join(ROOT, n))]
    except (OSError, subprocess.CalledProcessError):
        pass
    names = []
    for dirpath, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in (".git", "build", "__pycache__", ".pytest_cache")]
        names += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in files]
    return sorted(names)


def build_sdist(sdist_directory, config_settings=None):
    base = "ferry-%s" % _version()
    os.makedirs(sdist_directory, exist_ok=True)
    with tarfile.open(os.path.join(sdist_directory, base + ".tar.gz"), "w:gz",
                      format=tarfile.PAX_FORMAT) as tf:
        for rel in sorted(_sdist_files()):
            tf.add(os.path.join(ROOT, rel), arcname=base + "/" + rel, recursive=False)
        _, metadata = _metadata()
        info = tarfile.TarInfo(base + "/PKG-INFO")
        data = metadata.encode("utf-8")
        info.size, info.mode = len(data), 0o644
        tf.addfile(info, io.BytesIO(data))
    return base + ".tar.gz"
