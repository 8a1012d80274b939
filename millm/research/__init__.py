"""Research on the engine: strength sweeps, the screen, and the measures the benches share. Everything here
samples and scores through the engine's request path, so a measured strength is what a request gets."""
