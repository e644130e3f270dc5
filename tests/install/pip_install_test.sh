#!/usr/bin/env bash
# pip_install_test.sh SOURCE_DIR [PYTHON]: `pip install .` as a user does it, offline:
#   - a venv of PYTHON (--system-site-packages), `pip install --no-build-isolation --no-index`
#     of the source tree; from the venv, `import ferry` (the venv's copy, an engine made) and the
#     `ferry` CLI on the venv's PATH (`--version`, `info`);
#   - `pip wheel` of the same tree: the wheel's RECORD hashes match its files, its binaries carry
#     no path of the build machine, and it installs into a second, bare venv where both run too.
# The wheel compiles in a build tree of its own (FERRY_BUILD_DIR, a temporary one unless set)
# through ccache; CMAKE_BUILD_PARALLEL_LEVEL defaults to 2. Exits 77 (skipped) where PYTHON has
# no venv/ensurepip (Debian: python3-venv).
set -euo pipefail
src=$(cd "$1" && pwd)
py=${2:-python3}
"$py" -c 'import venv, ensurepip' 2>/dev/null || { echo "pip_install_test: skipped: $py has no venv/ensurepip"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export FERRY_BUILD_DIR=${FERRY_BUILD_DIR:-$tmp/build}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
unset PYTHONPATH
step() { echo "== pip_install_test: $* ($SECONDS s)"; }
fail() { echo "pip_install_test: FAIL: $*" >&2; exit 1; }

check_venv() {  # check_venv VENV: the installed package and CLI work from VENV
  local venv=$1 out
  out=$(cd "$tmp" && "$venv/bin/python" -c '
import os, sys, ferry
assert os.path.realpath(ferry.__file__).startswith(os.path.realpath(sys.prefix)), ferry.__file__
e = ferry.Engine(key="pip-test")
print("import ferry:", ferry.__file__)') || fail "import ferry in $venv"
  echo "$out"
  [ "$(PATH=$venv/bin:/usr/bin:/bin command -v ferry)" = "$venv/bin/ferry" ] || fail "ferry is not on $venv's PATH"
  PATH=$venv/bin:$PATH ferry --version | grep -q "[0-9]" || fail "ferry --version in $venv"
  PATH=$venv/bin:$PATH ferry info >"$tmp/info.log" 2>&1 || { cat "$tmp/info.log"; fail "ferry info in $venv"; }
}

step "venv (--system-site-packages) of $py"
"$py" -m venv --system-site-packages "$tmp/venv"
step "pip install --no-build-isolation --no-index $src (build tree $FERRY_BUILD_DIR)"
"$tmp/venv/bin/python" -m pip install -q --no-build-isolation --no-index "$src" || fail "pip install"
check_venv "$tmp/venv"

step "pip wheel"
"$tmp/venv/bin/python" -m pip wheel -q --no-build-isolation --no-index --no-deps -w "$tmp/wheels" "$src" ||
  fail "pip wheel"
wheel=$(ls "$tmp"/wheels/ferry-*.whl)
"$tmp/venv/bin/python" - "$wheel" <<'PY' || fail "wheel contents"
import base64, hashlib, re, sys, zipfile
zf = zipfile.ZipFile(sys.argv[1])
names = set(zf.namelist())
record = next(n for n in names if n.endswith(".dist-info/RECORD"))
listed = set()
for line in zf.read(record).decode().splitlines():
    path, digest, size = line.rsplit(",", 2)
    listed.add(path)
    if path == record:
        continue
    data = zf.read(path)
    want = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert digest == want and int(size) == len(data), path
assert listed == names, names ^ listed
assert any(re.match(r"ferry/_ferry\..*\.so$", n) for n in names), names
assert "ferry/_ferry.pyi" in names and "ferry/py.typed" in names, names  # type stubs, PEP 561
cli = next(n for n in names if re.match(r"ferry-[^/]+\.data/scripts/ferry$", n))
assert (zf.getinfo(cli).external_attr >> 16) & 0o111, "the CLI is not executable"
meta = zf.read(record.replace("RECORD", "METADATA")).decode()
assert "License: Apache-2.0" in meta, meta[:500]
print("wheel:", sys.argv[1].rsplit("/", 1)[-1], len(names), "files, RECORD checked")
PY
mkdir "$tmp/unpacked"
(cd "$tmp/unpacked" && "$tmp/venv/bin/python" -m zipfile -e "$wheel" .)
for f in $(find "$tmp/unpacked" -name '*.so' -o -path '*scripts/ferry'); do
  if readelf -d "$f" | grep -E "RPATH|RUNPATH" | grep -q "$FERRY_BUILD_DIR\|$src"; then
    fail "$f keeps a build path: $(readelf -d "$f" | grep -E 'RPATH|RUNPATH')"
  fi
  if ldd "$f" | grep -q "not found"; then fail "$f: $(ldd "$f" | grep 'not found')"; fi
done
step "the wheel in a bare venv"
"$py" -m venv "$tmp/bare"
"$tmp/bare/bin/python" -m pip install -q --no-index "$wheel" || fail "pip install $wheel"
check_venv "$tmp/bare"
step "OK"
