#!/usr/bin/env bash
# install_test.sh BUILD_DIR [CXX]: installs the built tree BUILD_DIR into a temporary prefix and
# uses it as an outside project would:
#   - the expected files are there (headers, libferry.so and .a, CMake package, .pc files, CLI,
#     LICENSE), and libferry.so exports the engine, KV and embedding APIs;
#   - every public header compiles alone with only the prefix on the include path (so they
#     include nothing but the standard library and each other);
#   - consumer/ (two engines, a local write, bytes checked) builds and runs with
#     find_package(ferry) (shared, then COMPONENTS static) and with pkg-config (ferry, then
#     ferry-static); the shared builds load the installed libferry.so, the static ones none;
#   - the installed `ferry` CLI runs;
#   - where the build has the Python module, `--component python` installs the package with its
#     type stubs (_ferry.pyi) and PEP 561 marker (py.typed).
set -euo pipefail
build=$(cd "$1" && pwd)
cxx=${2:-c++}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

step() { echo "== install_test: $*"; }
fail() { echo "install_test: FAIL: $*" >&2; exit 1; }

step "cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; fail "cmake --install"; }
libdir=
for d in lib lib64 lib/*-linux-gnu; do
  if [ -z "$libdir" ] && [ -e "$prefix/$d/libferry.so" ]; then libdir=$d; fi
done
[ -n "$libdir" ] || fail "no libferry.so under $prefix"
for f in include/ferry/engine.h include/ferry/kv.h include/ferry/embed.h "$libdir/libferry.a" \
         "$libdir/cmake/ferry/ferryConfig.cmake" "$libdir/cmake/ferry/ferryConfigVersion.cmake" \
         "$libdir/pkgconfig/ferry.pc" "$libdir/pkgconfig/ferry-static.pc" bin/ferry \
         share/doc/ferry/LICENSE; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
[ "$(ls "$prefix/include/ferry" | wc -l)" -eq "$(ls "$here/../../include/ferry"/*.h | wc -l)" ] ||
  fail "not every public header installed"
grep -q "Apache License" "$prefix/share/doc/ferry/LICENSE" || fail "LICENSE"
soname=$(objdump -p "$prefix/$libdir/libferry.so" | awk '/SONAME/ {print $2}')
[[ $soname == libferry.so.* ]] || fail "SONAME is '$soname'"
# The engine, the KV connector and the embedding service are defined (exported) by the library;
# the CUDA runtime, when linked in, is not.
syms=$(nm -D --defined-only -C "$prefix/$libdir/libferry.so")
for s in "ferry::Engine::Create" "ferry::kv::Connector::Create" "ferry::embed::ParseDtype"; do
  grep -q "$s" <<<"$syms" || fail "libferry.so does not export $s"
done
if grep -qw "cudaMalloc" <<<"$syms"; then fail "libferry.so exports the CUDA runtime"; fi

if ls "$build"/python/ferry/_ferry*.so >/dev/null 2>&1; then
  step "cmake --install $build --component python"
  cmake --install "$build" --prefix "$prefix/py" --component python >"$tmp/install_py.log" ||
    { cat "$tmp/install_py.log"; fail "cmake --install --component python"; }
  pkg=$(dirname "$(find "$prefix/py" -name '__init__.py' -path '*/ferry/*' | head -1)")
  [ -d "$pkg" ] || fail "no ferry package installed under $prefix/py"
  for f in _ferry.pyi py.typed; do
    [ -f "$pkg/$f" ] || fail "the python component did not install ferry/$f"
  done
  cmp -s "$pkg/_ferry.pyi" "$here/../../python/ferry/_ferry.pyi" || fail "installed _ferry.pyi differs from the source"
else
  step "no Python module in $build: the python component is not checked"
fi

step "each public header compiles alone"
for h in "$prefix"/include/ferry/*.h; do
  echo "#include \"ferry/$(basename "$h")\"" >"$tmp/one.cc"
  "$cxx" -std=c++20 -fsyntax-only -I"$prefix/include" "$tmp/one.cc" || fail "$(basename "$h") alone"
done

check_run() {  # check_run NAME BINARY SHARED(yes|no)
  local out deps
  out=$("$2") || fail "$1: the consumer failed"
  grep -q "bytes checked" <<<"$out" || fail "$1: unexpected output: $out"
  deps=$(ldd "$2")
  if [ "$3" = yes ]; then
    grep -q "libferry.so.* => $prefix/$libdir/libferry.so" <<<"$deps" || fail "$1 does not load the installed libferry.so: $deps"
  elif grep -q libferry <<<"$deps"; then
    fail "$1 (static) loads libferry: $deps"
  fi
  echo "$1: $out"
}

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
for kind in shared static; do
  step "find_package(ferry), $kind"
  static=OFF
  [ "$kind" = static ] && static=ON
  cmake -S "$here/consumer" -B "$tmp/cmake-$kind" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_PREFIX_PATH="$prefix" -DCONSUMER_STATIC=$static \
    >"$tmp/cmake-$kind.log" 2>&1 || { cat "$tmp/cmake-$kind.log"; fail "configure ($kind)"; }
  cmake --build "$tmp/cmake-$kind" >>"$tmp/cmake-$kind.log" 2>&1 ||
    { cat "$tmp/cmake-$kind.log"; fail "build ($kind)"; }
  check_run "cmake-$kind" "$tmp/cmake-$kind/consumer" $([ $kind = shared ] && echo yes || echo no)
done

export PKG_CONFIG_PATH=$prefix/$libdir/pkgconfig
step "pkg-config ferry: $(pkg-config --cflags --libs ferry)"
# shellcheck disable=SC2046
"$cxx" -std=c++20 -O1 "$here/consumer/main.cc" -o "$tmp/pc-shared" $(pkg-config --cflags --libs ferry) \
  -Wl,-rpath,"$prefix/$libdir" || fail "pkg-config ferry: build"
check_run pkg-config-shared "$tmp/pc-shared" yes
step "pkg-config ferry-static: $(pkg-config --cflags --libs ferry-static)"
# shellcheck disable=SC2046
"$cxx" -std=c++20 -O1 "$here/consumer/main.cc" -o "$tmp/pc-static" $(pkg-config --cflags --libs ferry-static) ||
  fail "pkg-config ferry-static: build"
check_run pkg-config-static "$tmp/pc-static" no

step "the installed CLI"
version=$("$prefix/bin/ferry" --version) || fail "ferry --version"
grep -q "$(sed -n 's/^Version: //p' "$PKG_CONFIG_PATH/ferry.pc")" <<<"$version" || fail "ferry --version: $version"
"$prefix/bin/ferry" info >"$tmp/info.log" 2>&1 || { cat "$tmp/info.log"; fail "ferry info"; }
echo "install_test: OK"
