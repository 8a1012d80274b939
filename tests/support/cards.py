"""Feature-card rows (a features.jsonl's records) and a label table, read by the card, search and TUI tests."""


def measured(strength, rate=0.5, recommended=True):
    """The keys a held-out measure writes into a row (``millm.sae.measured``): recommending ``strength`` (its
    interval reaching the target) or not (an interval that misses it)."""
    high = 0.69 if recommended else 0.5
    held = {"prompt_set": "neutral-v1", "strength": strength, "calibration_rate": 0.75, "rate": rate,
            "interval": [0.3, high], "answers": 16, "tokens": 24, "seed": 0, "fluency": -0.4, "relevance": -0.1,
            "degeneration": 0.0, "target": 0.6, "bound": 1.5, "recommended": recommended}
    return {"held_out": held, **({"recommended_strength": strength} if recommended else {})}


ROWS = [
    {"index": 3, "label": "rain, storm, weather", "frequency": 0.0125, "max_activation": 17.5,
     "top_tokens": [["rain", 40.5], ["storm", 12.0]],
     "examples": [{"text": "then the« rain» fell", "activation": 17.5}, {"text": "no marks here", "activation": 2.0}],
     "promotes": [" umbrella", "wet"]},
    {"index": 8, "label": "rainbow, colours", "frequency": 0.002, "max_activation": 9.0, "top_tokens": [],
     "examples": [], "promotes": [], **measured(60.0)},
]

TABLE = {1: "rainbow, colours", 2: "heavy rain, storm", 3: "rain, wet", 4: "drain, pipe", 5: "weather, rain",
         6: "terrain, maps", 7: "brain, mind"}
