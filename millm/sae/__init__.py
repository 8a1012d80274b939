"""Sparse autoencoders: their math (``millm.sae.model``) and the formats they are published in.

Nothing is imported here, so naming a submodule does not load torch.
"""
