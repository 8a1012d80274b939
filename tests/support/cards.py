"""Feature-card rows (a features.jsonl's records) and a label table, read by the card, search and TUI tests."""

ROWS = [
    {"index": 3, "label": "rain, storm, weather", "frequency": 0.0125, "max_activation": 17.5,
     "top_tokens": [["rain", 40.5], ["storm", 12.0]],
     "examples": [{"text": "then the« rain» fell", "activation": 17.5}, {"text": "no marks here", "activation": 2.0}],
     "promotes": [" umbrella", "wet"]},
    {"index": 8, "label": "rainbow, colours", "frequency": 0.002, "max_activation": 9.0, "top_tokens": [],
     "examples": [], "promotes": [], "recommended_strength": 60.0},
]

TABLE = {1: "rainbow, colours", 2: "heavy rain, storm", 3: "rain, wet", 4: "drain, pipe", 5: "weather, rain",
         6: "terrain, maps", 7: "brain, mind"}
