#!/usr/bin/env bash
# NVIDIA's pip builds of UCX (PyPI's libucx-cu12 and libucx-cu13: built with CUDA, without verbs) as
# targets gmd builds for and is tested against. Each lives in a Python virtual environment made at
# run time from the wheel, cached outside the clone ($GMD_PIP_CACHE, default /var/cache/gmd/pip):
# the wheel's libucx/ directory is a UCX prefix (bin/, include/, lib/, lib/pkgconfig/, lib/ucx/).
#
#   pip-ucx.sh list                   the releases .ci/run tests, one per UCX minor PyPI serves
#   pip-ucx.sh name SPEC              its short name: pip-MINOR, -cu13 appended for a CUDA 13 build
#                                     (gmd's build directory for it is build-NAME)
#   pip-ucx.sh prefix SPEC            makes the environment for SPEC (e.g. libucx-cu12==1.15.0.post2)
#                                     once, prints its UCX prefix
#   pip-ucx.sh build SPEC DIR [ARGS]  configures and builds gmd in DIR against it (ARGS: cmake
#                                     options, then -- and build options)
#   pip-ucx.sh env SPEC               prints the environment that runs that UCX's tools with gmd
#                                     (PATH, LD_LIBRARY_PATH), for eval
#   pip-ucx.sh libs PREFIX            prints the library path of a wheel's UCX prefix: PREFIX/lib
#                                     and the CUDA runtime folder older wheels keep beside it
#
# The wheel's pkg-config files name the prefix it was built in; pkg-config's --define-prefix (which
# gmd's configure passes, PKG_CONFIG_ARGN) takes the prefix from where the .pc file lies instead.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

GMD_PIP_CACHE=${GMD_PIP_CACHE:-/var/cache/gmd/pip}

# The newest build of each minor on PyPI (pip index versions libucx-cu12 / -cu13): 1.14 to 1.18 only
# as cu12, 1.19 on as both; one CUDA 13 build is tested beside them.
GMD_PIP_RELEASES=(
  libucx-cu12==1.14.1.post2 libucx-cu12==1.15.0.post2 libucx-cu12==1.16.0.post2
  libucx-cu12==1.17.0.post1 libucx-cu12==1.18.1 libucx-cu12==1.19.0 libucx-cu12==1.20.1
  libucx-cu12==1.21.0 libucx-cu12==1.22.0 libucx-cu13==1.22.0
)

# SPEC -> its environment's directory name (libucx-cu12-1.15.0.post2).
pip_env_dir() { echo "$GMD_PIP_CACHE/${1/==/-}"; }

# PREFIX -> the library path its tools need. Older wheels' tools link the CUDA runtime the wheel
# keeps beside the package (libucx_cu*.libs).
pip_libs() {
  local libs=$1/lib d
  for d in "$1"/../libucx_cu*.libs; do [[ -d $d ]] && libs+=:$d; done
  echo "$libs"
}

pip_prefix() {
  local spec=$1 dir
  dir=$(pip_env_dir "$spec")
  if [[ ! -f $dir/.complete ]]; then
    rm -rf "$dir"
    mkdir -p "$GMD_PIP_CACHE"
    python3 -m venv "$dir" >&2
    "$dir/bin/python" -m pip install -q --disable-pip-version-check --no-deps "$spec" >&2
    touch "$dir/.complete"
  fi
  local prefix
  prefix=$("$dir/bin/python" -c 'import libucx, os; print(os.path.dirname(libucx.__file__))')
  [[ -f $prefix/include/uct/api/version.h ]] || {
    echo "pip-ucx: $spec has no UCX headers under $prefix" >&2
    return 1
  }
  echo "$prefix"
}

case ${1:-} in
  list)
    printf '%s\n' "${GMD_PIP_RELEASES[@]}"
    ;;
  name)
    version=${2#*==} cuda=${2%%==*}
    cuda=${cuda#libucx-}
    echo "pip-$(echo "$version" | cut -d. -f1,2)$([[ $cuda == cu12 ]] || echo "-$cuda")"
    ;;
  prefix)
    pip_prefix "$2"
    ;;
  env)
    prefix=$(pip_prefix "$2")
    libs=$(pip_libs "$prefix")
    printf 'export PATH=%q:"$PATH" LD_LIBRARY_PATH=%q\n' "$prefix/bin" "$libs"
    ;;
  libs)
    pip_libs "$2"
    ;;
  build)
    spec=$2 dir=$3
    shift 3
    prefix=$(pip_prefix "$spec")
    PKG_CONFIG_PATH=$prefix/lib/pkgconfig gmd_build "$dir" -G Ninja -DPKG_CONFIG_ARGN=--define-prefix \
      -DCMAKE_PREFIX_PATH="$prefix" "$@"
    ;;
  *)
    echo "usage: $0 list | name SPEC | prefix SPEC | env SPEC | build SPEC DIR [CMAKE_ARGS...] [-- BUILD_ARGS...]" >&2
    exit 2
    ;;
esac
