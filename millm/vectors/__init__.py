"""Steering vectors learned from examples: difference-in-means (AxBench's DiffMean) and PCA directions at one
layer's residual stream, stored as vector sets that steer wherever SAE features do."""

EXAMPLES = 128  # generated examples of each side by default (64 leave a direction's halves at cosine 0.7-0.8)
