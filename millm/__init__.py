"""miLLM: a local inference server that steers language models by SAE features."""

import os

__version__ = "0.1.0"

# Read once, when the libraries start, so set here before anything can compute (millm.engine.reproducible says
# why): MKL's reproducible mode, so that every front end's forwards round the same at every thread count (a value
# already set, an empty one included, is kept); and OpenMP's dynamic mode off, which on a busy machine leaves part of
# a packed product unwritten.
os.environ.setdefault("MKL_CBWR", "AUTO")
if os.environ.get("OMP_DYNAMIC", "false").strip().lower() not in ("false", ""):
    os.environ["OMP_DYNAMIC"] = "false"
