"""Sparse autoencoders: their math and the formats they are published in."""

from millm.sae.model import SAE

__all__ = ["SAE"]
