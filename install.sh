#!/usr/bin/env bash
# Install miLLM from this checkout: the CPU build of torch first (no multi-GB CUDA download), then the
# package (pass "test" for the test extras), then make sure llama.cpp runs on this CPU.
set -euo pipefail
cd "$(dirname "$0")"
extras=${1:+[$1]}
pip install torch==2.13.0
pip install -e ".${extras}"
if ! python -m millm.engine.llama_check >/dev/null 2>&1; then
    # A -march=native build can crash on CPUs whose AMX the kernel does not grant: rebuild portably.
    version=$(python -c "import importlib.metadata as m; print(m.version('llama-cpp-python'))")
    echo "llama.cpp crashed on this CPU; rebuilding llama-cpp-python $version for AVX2 (a few minutes)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON" \
        pip install --force-reinstall --no-deps --no-cache-dir "llama-cpp-python==$version"
    python -m millm.engine.llama_check
fi
