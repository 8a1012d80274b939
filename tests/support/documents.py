"""A cluster and a circuit document over a registry of three SAEs, read by the steering and store tests."""

from millm.steering.documents import Registered

REG = Registered(widths={"sae_a": 512, "sae_b": 256, "sae_c": 64}, attached={3: "sae_a", 10: "sae_b"})

CLUSTER = {
    "kind": "cluster", "name": "weather", "model": "SmolLM2-135M-Instruct", "description": "rain words",
    "sae": {"layer": 3, "d_sae": 512, "id": "sae_a"},
    "members": [{"feature": f, "strength": 10.0 * f, "label": f"f{f}"} for f in (1, 2, 3, 4)],
    "intensity_range": [0.5, 1.5],
}
CIRCUIT = {
    "kind": "circuit", "name": "rain-circuit", "model": "SmolLM2-135M-Instruct",
    "members": [{"layer": 3, "sae": "sae_a", "feature": 5, "strength": 30.0},
                {"layer": 3, "feature": 6, "strength": -10.0},
                {"layer": 10, "feature": 200, "strength": 20.0, "label": "drizzle"}],
    "intensity_range": [0.5, 1.5], "evidence": {"rung": 2, "method": "activation patching"},
    "fallback_cluster": "weather",
}
