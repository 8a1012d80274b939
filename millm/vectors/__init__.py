"""Steering vectors learned from examples: difference-in-means (AxBench's DiffMean) and PCA directions at one
layer's residual stream, stored as vector sets that steer wherever SAE features do."""
