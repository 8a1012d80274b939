"""miLLM: a local inference server that steers language models by SAE features."""

__version__ = "0.1.0"
