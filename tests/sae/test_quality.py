"""The held-out reconstruction figures (millm.sae.training.quality) on hand-built tensors: FVU, CE share, splice, CE."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    import torch

    from millm.sae.model import SAE



def first_coordinate_sae() -> SAE:
    """A ReLU SAE on d_in 2 whose two features read +x0 and -x0: it reconstructs x0 exactly and puts its
    b_dec (1) in place of x1."""
    import torch

    from millm.sae.model import SAE

    W_enc = torch.tensor([[1.0, -1.0], [0.0, 0.0]])
    return SAE(W_enc=W_enc, b_enc=torch.zeros(2), W_dec=W_enc.T.clone(), b_dec=torch.tensor([0.0, 1.0]),
               apply_b_dec_to_input=False)


def points() -> torch.Tensor:
    import torch

    return torch.tensor([[1.0, 0.0], [3.0, 0.0], [1.0, 2.0], [-3.0, 2.0]])
# mean (0.5, 1); sum of squares around it: x0 (0.25+6.25+0.25+12.25) = 19, x1 4*1 = 4, total 23
# reconstruction (x0, 1): residual only in x1, 4*1 = 4; FVU = 4/23


def test_fvu_of_a_hand_built_sae_is_residual_over_variance() -> None:
    from millm.sae.training.quality import fvu
    from millm.sae.training.train import fraction_unexplained

    X = points()
    sae = first_coordinate_sae()
    value, fired = fvu(sae, X)
    assert value == pytest.approx(4 / 23)
    assert fired.tolist() == [True, True]  # +x0 fires on rows 0-2, -x0 on row 3
    assert fvu(sae, X, chunk=3)[0] == pytest.approx(4 / 23)  # chunked sums give the whole's figure
    assert float(fraction_unexplained(X, sae.decode(sae.encode(X)))) == pytest.approx(4 / 23)
    assert fvu(sae, X[:3])[1].tolist() == [True, False]


def test_fvu_is_zero_for_an_exact_sae_and_one_for_the_mean() -> None:
    import torch

    from millm.sae.model import SAE
    from millm.sae.training.quality import fvu

    X = points()
    eye = torch.eye(2)
    exact = SAE(W_enc=torch.cat([eye, -eye], 1), b_enc=torch.zeros(4), W_dec=torch.cat([eye, -eye], 0),
                b_dec=torch.zeros(2), apply_b_dec_to_input=False)
    assert fvu(exact, X)[0] == pytest.approx(0.0, abs=1e-12)
    mean_only = SAE(W_enc=torch.zeros(2, 1), b_enc=torch.zeros(1), W_dec=torch.zeros(1, 2), b_dec=X.mean(0),
                    apply_b_dec_to_input=False)
    value, fired = fvu(mean_only, X)
    assert value == pytest.approx(1.0)
    assert not fired.any()


def test_ce_share_is_the_sae_part_of_the_zero_ablation_gap() -> None:
    from millm.sae.training.quality import ce_share

    assert ce_share(clean=2.0, spliced=2.5, zeroed=7.0) == pytest.approx(0.1)
    assert ce_share(clean=2.0, spliced=2.0, zeroed=7.0) == 0.0
    assert ce_share(clean=2.0, spliced=7.0, zeroed=7.0) == 1.0
    assert ce_share(clean=3.0, spliced=2.9, zeroed=5.0) == pytest.approx(-0.05)  # an SAE may even help
    assert math.isnan(ce_share(clean=2.0, spliced=2.1, zeroed=2.0))


def test_splice_replaces_all_but_each_window_first_position() -> None:
    import torch

    from millm.sae.training.quality import splice

    hidden = torch.tensor([[[5.0, 6.0], [1.0, 2.0], [-3.0, 4.0]]])
    zeroed = splice(None)(hidden)
    assert zeroed.tolist() == [[[5.0, 6.0], [0.0, 0.0], [0.0, 0.0]]]
    spliced = splice(first_coordinate_sae())(hidden)
    assert spliced.tolist() == [[[5.0, 6.0], [1.0, 1.0], [-3.0, 1.0]]]
    assert hidden.tolist() == [[[5.0, 6.0], [1.0, 2.0], [-3.0, 4.0]]]  # the layer's own output is untouched


def fixed_logits() -> torch.nn.Module:
    """A 'model' predicting token 0 with logit log(3) over a vocabulary of 3 (probabilities 0.6, 0.2, 0.2)."""
    import torch

    class FixedLogits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(()))

        def forward(self, input_ids: torch.Tensor, use_cache: bool = False) -> SimpleNamespace:
            logits = torch.zeros(*input_ids.shape, 3)
            logits[..., 0] = math.log(3.0)
            return SimpleNamespace(logits=logits)

    return FixedLogits()


def test_next_token_loss_is_the_mean_over_every_next_token() -> None:
    import torch

    from millm.sae.training.quality import next_token_loss

    windows = torch.tensor([[1, 0, 0], [2, 0, 1], [0, 1, 2]])  # targets: 0 0 | 0 1 | 1 2: three 0s, three others
    expected = (3 * -math.log(0.6) + 3 * -math.log(0.2)) / 6
    assert next_token_loss(fixed_logits(), windows, batch=2) == pytest.approx(expected)
