"""The screen's estimate counts only tokens that start a mention of the concept, on a hand-built vocabulary."""

from millm.engine.params import TextPrompt

VOCAB = {" sport": 1, " sports": 2, " Sport": 3, "rain": 4, " rain": 5, "Rain": 6, " rains": 7, "s": 8, "S": 9,
         "p": 10, "o": 11, "r": 12, "t": 13, "R": 14, "a": 15, "i": 16, "n": 17, " ": 18, "e": 19}


class SplitTokenizer:
    """An engine's tokenizer where whole strings in VOCAB are one token and anything else splits into characters."""

    def tokenize(self, prompt: TextPrompt) -> list[int]:
        text = prompt.text
        return [VOCAB[text]] if text in VOCAB else [VOCAB[c] for c in text]


def test_word_tokens_are_the_one_token_forms_of_each_word_and_its_plural():
    from millm.research.screen import word_tokens

    assert word_tokens(SplitTokenizer(), ["rain"]) == [4, 5, 6, 7]


def test_a_form_the_tokenizer_splits_contributes_no_fragment():
    # "sport" and "Sports" split into letters: their first pieces ("s", "S") start many other words
    from millm.research.screen import word_tokens

    assert word_tokens(SplitTokenizer(), ["sport"]) == [1, 2, 3]


def test_the_mention_chance_is_one_minus_the_chance_of_no_mention_averaged():
    from millm.research.screen import mention_chance

    assert mention_chance([[0.5, 0.5], [0.0]]) == (0.75 + 0.0) / 2
    assert mention_chance([]) == 0.0
