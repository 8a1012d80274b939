"""A feature card as rich text: what ``millm sae features SAE INDEX`` prints and the TUI's card shows.

Labels, tokens and examples are data, never markup: everything is assembled as ``Text`` spans.
"""

from __future__ import annotations

import json

from rich.text import Text

from millm.sae.cards import FeatureCard, example_parts

FIRING = "bold black on yellow"


def _token(text: str) -> str:
    """A token as shown: whitespace made visible, so " the" and "the" differ on screen."""
    return text.replace("\n", "\\n").replace("\t", "\\t")


def example_text(text: str) -> Text:
    """A max-activating context with its firing token (between « and ») highlighted."""
    before, firing, after = example_parts(text)
    return Text.assemble(_token(before), (_token(firing), FIRING) if firing else "", _token(after))


def _measured(card: FeatureCard) -> str:
    """The line saying how the feature was measured to steer: its recommended strength with the held-out rate and
    interval it rests on, or that none is recommended and the best held-out point."""
    held = card.held_out
    assert held is not None
    if held.recommended:
        return f"\nmeasured to steer: recommended strength {held.strength:g} ({held.describe()})"
    return f"\nmeasured: no recommended strength ({held.describe()}; target {held.target:.0%})"


def _firing(card: FeatureCard) -> str:
    """How often the feature fired on the labelling tokens and how strongly, as far as ``features.jsonl`` says."""
    frequency = "" if card.frequency is None else f"\nfires on {card.frequency:.3%} of labelling tokens"
    peak = "" if card.max_activation is None else f" · max activation {card.max_activation:g}"
    return frequency + peak


def _top_tokens(card: FeatureCard) -> Text:
    """The tokens the feature fires on most, with their weights (nothing when none were recorded)."""
    out = Text()
    if card.top_tokens:
        out.append("\ntop tokens  ", style="bold")
        for k, (token, weight) in enumerate(card.top_tokens):
            out.append_text(Text.assemble("" if k == 0 else " · ", (_token(token), "cyan"), (f" {weight:g}", "dim")))
    return out


def _examples(card: FeatureCard) -> Text:
    """The max-activating examples, one a line with its activation (nothing when none were recorded)."""
    out = Text()
    if card.examples:
        out.append("\nmax-activating examples", style="bold")
        for example in card.examples:
            out.append_text(Text.assemble("\n", (f"{example.activation:8.2f}  ", "dim"), example_text(example.text)))
    return out


def _promotes(card: FeatureCard) -> Text:
    """The tokens the feature's decoder direction promotes (nothing when none were recorded)."""
    out = Text()
    if card.promotes:
        out.append("\npromotes  ", style="bold")
        out.append_text(Text(" ").join(Text(json.dumps(t, ensure_ascii=False), "magenta") for t in card.promotes))
    return out


def card_text(card: FeatureCard) -> Text:
    """The whole card: label and width, then what ``features.jsonl`` recorded (or why nothing is)."""
    out = Text.assemble((f"#{card.index}", "bold cyan"), "  ", (card.label or "(no label)", "bold"),
                        (f"   {card.sae}, {card.d_sae} features", "dim"))
    if card.measured:
        out.append(_measured(card), style="green" if card.recommended_strength is not None else "yellow")
    if not card.recorded:
        out.append(f"\n{card.note}", style="dim")
        return out
    out.append(_firing(card))
    for section in (_top_tokens(card), _examples(card), _promotes(card)):
        out.append_text(section)
    return out
