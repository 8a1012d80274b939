#!/usr/bin/env bash
# Install miLLM from this checkout: the CPU build of torch first (no multi-GB CUDA download), then the
# package (pass "test" for the test extras), then make sure llama.cpp runs on this CPU.
set -euo pipefail
cd "$(dirname "$0")"
extras=${1:+[$1]}
PORTABLE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"

# A CPU that advertises AMX under a kernel or VM that does not enable it crashes a -march=native
# llama.cpp build (ggml's AMX kernels). Probe once, before the first build, so a fresh install builds once.
amx_unusable() {
    grep -q amx_tile /proc/cpuinfo 2>/dev/null && command -v cc >/dev/null || return 1
    local dir
    dir=$(mktemp -d)
    cat > "$dir/probe.c" <<'C'
#include <immintrin.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(void) {
    unsigned char cfg[64];
    if (syscall(SYS_arch_prctl, 0x1023, 18)) return 2;  /* ARCH_REQ_XCOMP_PERM, XTILEDATA */
    memset(cfg, 0, sizeof cfg); cfg[0] = 1; cfg[16] = 64; cfg[48] = 16;
    _tile_loadconfig(cfg); _tile_zero(0); _tile_release();
    return 0;
}
C
    local status=0
    cc -O1 -mamx-tile "$dir/probe.c" -o "$dir/probe" 2>/dev/null && { ("$dir/probe"; exit $?) 2>/dev/null || status=1; }
    rm -rf "$dir"
    return $((1 - status))
}

pip install torch==2.13.0
if ! python -c "import llama_cpp" 2>/dev/null && amx_unusable; then
    echo "this CPU advertises AMX but cannot run it: building llama.cpp for portable AVX2"
    export CMAKE_ARGS="${CMAKE_ARGS:-$PORTABLE}"
fi
pip install -e ".${extras}"
if ! python -m millm.engine.llama_check >/dev/null 2>&1; then
    # A -march=native build can still crash on a CPU the probe did not catch: rebuild portably.
    version=$(python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
    echo "llama.cpp crashed on this CPU; rebuilding llama-cpp-python $version for AVX2 (a few minutes)"
    CMAKE_ARGS="$PORTABLE" pip install --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$version"
    python -m millm.engine.llama_check
fi

# The console's browser tests drive the system's Chromium (a browser download does not work here): the test
# install adds Debian's chromium when it is missing.
if [ "${1:-}" = "test" ] && ! command -v chromium >/dev/null 2>&1; then
    echo "installing Debian's chromium for the console's browser tests"
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo -n"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get install -y chromium || { $sudo apt-get update && $sudo apt-get install -y chromium; }
fi
