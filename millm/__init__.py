"""miLLM: a local inference server that steers language models by SAE features."""

import os

__version__ = "0.1.0"

# MKL reads its numerical mode once, at its first computation: asked for here, before anything can compute, so
# that every front end's forwards round the same at every thread count (millm.engine.reproducible says why; the
# value is its MODE). A value already set, an empty one included, is left as it is.
os.environ.setdefault("MKL_CBWR", "AUTO")
