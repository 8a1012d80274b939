"""Probes: linear read-outs at one layer with a calibrated operating point, learned from examples, stored as JSON
documents, and served on generation requests (``millm.steering.probe`` scores them while decoding)."""
