#!/bin/sh
# Installs the kvsched C library under PREFIX: the header, the static library, the dynamic library with
# its SONAME links, and a pkg-config file.
#
#   cargo build --release -p kvsched-capi
#   capi/install.sh PREFIX [LIBDIR]
#
# LIBDIR is where cargo put the libraries (default: ${CARGO_TARGET_DIR:-target}/release). Under
# PREFIX: include/kvsched.h, lib/libkvsched_capi.a, lib/libkvsched_capi.so.VERSION with the links
# libkvsched_capi.so.ABI (the SONAME) and libkvsched_capi.so, and lib/pkgconfig/kvsched.pc. Then
#   cc app.c $(pkg-config --cflags --libs kvsched)
# with PKG_CONFIG_PATH=PREFIX/lib/pkgconfig unless PREFIX is one pkg-config searches already; at run time
# the loader must find the library: run ldconfig after installing into a system prefix, else set
# LD_LIBRARY_PATH=PREFIX/lib (or link with -Wl,-rpath,PREFIX/lib).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 PREFIX [LIBDIR]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
prefix=$1
libdir=${2:-${CARGO_TARGET_DIR:-target}/release}
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$here/Cargo.toml" | head -n 1)
# The SONAME's version (capi/build.rs): the major version, or 0.MINOR while it is 0.x.
case $version in
  0.*) abi=$(echo "$version" | cut -d. -f1,2) ;;
  *) abi=$(echo "$version" | cut -d. -f1) ;;
esac
for f in libkvsched_capi.a libkvsched_capi.so; do
  [ -f "$libdir/$f" ] || { echo "$libdir/$f is missing: cargo build --release -p kvsched-capi first" >&2; exit 1; }
done
mkdir -p "$prefix/include" "$prefix/lib/pkgconfig"
cp "$here/include/kvsched.h" "$prefix/include/kvsched.h"
cp "$libdir/libkvsched_capi.a" "$prefix/lib/libkvsched_capi.a"
rm -f "$prefix/lib/libkvsched_capi.so.$version"  # a new file, not one a running program maps rewritten
cp "$libdir/libkvsched_capi.so" "$prefix/lib/libkvsched_capi.so.$version"
ln -sf "libkvsched_capi.so.$version" "$prefix/lib/libkvsched_capi.so.$abi"
ln -sf "libkvsched_capi.so.$abi" "$prefix/lib/libkvsched_capi.so"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/kvsched.pc.in" >"$prefix/lib/pkgconfig/kvsched.pc"
echo "installed kvsched $version (SONAME libkvsched_capi.so.$abi) under $prefix"
