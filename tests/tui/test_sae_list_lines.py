"""The SAE list's lines: an SAE shows its width, a vector set how many vectors it holds (both read from the SAE
objects /api/saes lists)."""

from tui.client import SAEInfo
from tui.widgets.sae_list import SAEList


def test_a_vector_set_says_how_many_vectors_it_holds_and_an_sae_its_width():
    sae = SAEInfo.of({"id": "sae_1", "name": "res-L10", "d_sae": 4608, "layer_hint": 10, "attached_layer": 10,
                      "format": "saelens"})
    one = SAEInfo.of({"id": "dog", "name": "dog", "d_sae": 1, "layer_hint": 10, "attached_layer": None,
                      "format": "vectors"})
    two = SAEInfo.of({"id": "pets", "name": "pets", "d_sae": 2, "layer_hint": 8, "attached_layer": 8,
                      "format": "vectors"})
    assert not sae.vectors and one.vectors and two.vectors
    assert SAEList._line(sae).plain == "● res-L10 L10 ×4608"
    assert SAEList._line(one).plain == "○ dog hint L10 1 vector"
    assert SAEList._line(two).plain == "● pets L8 2 vectors"
