"""The research figures, described once: what a sweep's chart shows (its panels, series, reference lines and the
marked strength), for every front end that draws one. The console draws the description as SVG (``static/plot.js``,
coloured by its stylesheet) from ``GET /api/sweeps/{id}``'s ``figure``; ``millm steer sweep --out`` rasterises the
same description to a PNG (``millm.research.plots.figure_png``) in the light or dark theme's colours (``THEMES``,
the stylesheet's own)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

RGB = tuple[int, int, int]

# per theme: the background, the grid, and each class a figure's series and lines name (console.css's colours)
THEMES: dict[str, dict[str, RGB]] = {
    "light": {"background": (255, 255, 255), "grid": (228, 232, 238), "s1": (45, 93, 138), "s2": (179, 92, 0),
              "s3": (46, 125, 79), "ref-target": (45, 93, 138), "ref-bound": (164, 38, 44), "mark": (122, 63, 176)},
    "dark": {"background": (28, 34, 43), "grid": (38, 45, 56), "s1": (127, 179, 234), "s2": (240, 163, 94),
             "s3": (111, 207, 151), "ref-target": (127, 179, 234), "ref-bound": (255, 138, 138),
             "mark": (198, 156, 240)},
}


def sweep_figure(result: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep (``millm steer sweep --json``'s body) as a figure: concept rate against strength with the target
    rate; fluency and relevance with the fluency bound; the chosen strength marked."""
    points = result["points"]
    chosen = result.get("chosen_strength", result.get("recommended_strength"))
    return {
        "x_label": "strength",
        "xs": [p["strength"] for p in points],
        "panels": [
            {"title": "concept rate (share of answers that mention the concept)", "min": 0.0, "max": 1.0,
             "series": [{"name": "concept rate", "cls": "s1", "values": [p["rate"] for p in points]}],
             "lines": [{"y": result["target"], "cls": "ref-target", "label": f"target {result['target']:g}"}]},
            {"title": "fluency and relevance against the unsteered answers (nats/token)",
             "series": [{"name": "fluency", "cls": "s2", "values": [p["fluency"] for p in points]},
                        {"name": "relevance", "cls": "s3", "values": [p["relevance"] for p in points]}],
             "lines": [{"y": -result["bound"], "cls": "ref-bound", "label": f"bound -{result['bound']:g}"}]},
        ],
        "mark": None if chosen is None else {"x": chosen, "label": f"chosen {chosen:g}"},
    }
