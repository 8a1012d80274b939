"""What the docs' Scoring page (docs/scoring.md, once the README) says scoring refuses is what the field table
refuses on scoring requests (fast tier)."""

from __future__ import annotations

import re
from pathlib import Path

from millm.requests.fields import REFUSE, USE, policy

README = Path(__file__).resolve().parents[1] / "docs" / "scoring.md"


def scoring_bullet() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("- Scoring is never steered or monitored")
    return text[start:text.index("\n- ", start + 1)]


def test_the_fields_the_readme_says_scoring_refuses_are_refused():
    bullet = scoring_bullet()
    refused = re.findall(r"`([a-z_]+)`", bullet[:bullet.index("are refused on it")])
    assert refused, bullet
    for field in refused:
        for route in ("chat", "completions"):
            assert policy(field, route, "transformers", scoring=True) == REFUSE, (field, route)


def test_the_readme_says_scoring_serves_what_it_serves():
    bullet = scoring_bullet()
    for route in ("chat", "completions"):
        assert policy("return_sae_activations", route, "transformers", scoring=True) == USE
    after = " ".join(bullet[bullet.index("are refused on it"):].split())
    assert "`return_sae_activations` is served" in after
