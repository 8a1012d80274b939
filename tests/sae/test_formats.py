"""Each SAE format, written by the test, loads and encodes like the reference math."""

import json

import pytest

from millm.errors import InvalidSAE
from tests.support.saes import random_sae, write_gemma_scope, write_llama_scope, write_saelens, write_sparsify

D_IN, D_SAE = 16, 64


def reference(x, W_enc, b_enc, b_dec, arch, threshold=None, k=None, subtract_b_dec=True):
    import torch

    pre = (x - b_dec if subtract_b_dec else x) @ W_enc + b_enc
    if arch == "relu":
        return torch.relu(pre)
    if arch == "jumprelu":
        return torch.where(pre > threshold, pre, torch.zeros_like(pre)) * (pre > 0)
    acts = torch.relu(pre)
    keep = acts.topk(k, dim=-1).indices
    return torch.zeros_like(acts).scatter(-1, keep, acts.gather(-1, keep))


@pytest.fixture
def x():
    import torch

    return torch.randn(5, D_IN, generator=torch.Generator().manual_seed(1)) * 2


@pytest.mark.parametrize("v6", [False, True])
@pytest.mark.parametrize("arch", ["relu", "jumprelu", "topk"])
def test_saelens(tmp_path, x, arch, v6):
    import torch

    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE, architecture=arch, k=4 if arch == "topk" else None)
    loaded = load_sae(write_saelens(tmp_path / "s", sae, layer=3, v6=v6))
    assert loaded.format == "saelens" and loaded.layer_hint == 3 and loaded.model_hint == "SmolLM2-135M-Instruct"
    want = reference(x, sae.W_enc, sae.b_enc, sae.b_dec, arch, sae.threshold, 4, subtract_b_dec=True)
    assert torch.allclose(loaded.sae.encode(x), want, atol=1e-6)
    assert torch.allclose(loaded.sae.decode(want), want @ sae.W_dec + sae.b_dec, atol=1e-6)


def test_saelens_without_b_dec_subtraction_and_norm_rescale(tmp_path, x):
    import torch

    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE, apply_b_dec_to_input=False)
    loaded = load_sae(write_saelens(tmp_path / "s", sae, layer=1, normalize_activations="constant_norm_rescale"))
    scaled = x * D_IN ** 0.5 / x.norm(dim=-1, keepdim=True)
    want = reference(scaled, sae.W_enc, sae.b_enc, sae.b_dec, "relu", subtract_b_dec=False)
    assert torch.allclose(loaded.sae.encode(x), want, atol=1e-5)


def test_saelens_batchtopk_is_jumprelu_with_global_threshold(tmp_path, x):
    import torch

    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE)
    write_saelens(tmp_path / "s", sae, layer=2, v6=True, architecture="batchtopk", threshold=0.3)
    loaded = load_sae(tmp_path / "s")
    assert loaded.sae.architecture == "jumprelu"
    want = reference(x, sae.W_enc, sae.b_enc, sae.b_dec, "jumprelu", torch.full((D_SAE,), 0.3))
    assert torch.allclose(loaded.sae.encode(x), want, atol=1e-6)


def test_gemma_scope(tmp_path, x):
    import torch

    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE, architecture="jumprelu")
    loaded = load_sae(write_gemma_scope(tmp_path / "layer_7" / "width_16k" / "average_l0_50", sae))
    assert loaded.format == "gemma-scope" and loaded.layer_hint == 7
    want = reference(x, sae.W_enc, sae.b_enc, sae.b_dec, "jumprelu", sae.threshold, subtract_b_dec=False)
    assert torch.allclose(loaded.sae.encode(x), want, atol=1e-6)


def test_llama_scope_transposed_with_dataset_norm(tmp_path, x):
    import torch

    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE, apply_b_dec_to_input=False)  # unit decoder rows
    loaded = load_sae(write_llama_scope(tmp_path / "L3R", sae, threshold=0.05, norm_in=10.0))
    assert loaded.format == "llama-scope" and loaded.layer_hint == 3
    factor = D_IN ** 0.5 / 10.0
    pre = (x * factor) @ sae.W_enc + sae.b_enc  # training space; lm-saes folds the factor for inference
    want = torch.where(pre / factor > 0.05, pre / factor, torch.zeros_like(pre))
    assert torch.allclose(loaded.sae.encode(x), want, atol=1e-5)
    assert torch.allclose(loaded.sae.W_dec, sae.W_dec, atol=1e-6)


def test_sparsify_topk(tmp_path, x):
    import torch

    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE, architecture="topk", k=3)
    loaded = load_sae(write_sparsify(tmp_path / "layers.5", sae))
    assert loaded.format == "sparsify" and loaded.layer_hint == 5
    want = reference(x, sae.W_enc, sae.b_enc, sae.b_dec, "topk", k=3)
    assert torch.allclose(loaded.sae.encode(x), want, atol=1e-6)
    assert ((loaded.sae.encode(x) > 0).sum(-1) <= 3).all()


def test_encode_selected_features_matches_full(x):
    import torch

    for arch in ("relu", "jumprelu", "topk"):
        sae = random_sae(D_IN, D_SAE, architecture=arch, k=5 if arch == "topk" else None)
        feats = torch.tensor([3, 10, 40])
        assert torch.allclose(sae.encode(x, feats), sae.encode(x)[:, feats])


def test_malformed_files_name_file_and_key(tmp_path):
    from millm.sae.formats import load_sae

    sae = random_sae(D_IN, D_SAE)
    folder = write_saelens(tmp_path / "s", sae, layer=1)
    cfg = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**cfg, "d_sae": D_SAE + 1}))
    with pytest.raises(InvalidSAE, match=r"sae_weights.safetensors.*'W_enc' has shape"):
        load_sae(folder)
    (folder / "cfg.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "d_in"}))
    with pytest.raises(InvalidSAE, match=r"cfg.json: key 'd_in'"):
        load_sae(folder)
    jump = write_saelens(tmp_path / "j", random_sae(D_IN, D_SAE), layer=1, architecture="jumprelu")
    with pytest.raises(InvalidSAE, match=r"missing key 'threshold'"):
        load_sae(jump)
    with pytest.raises(InvalidSAE, match="no SAE found"):
        load_sae(tmp_path)
    (tmp_path / "bad.npz").write_bytes(b"nope")
    with pytest.raises(InvalidSAE, match="bad.npz"):
        load_sae(tmp_path / "bad.npz")


def test_unknown_architecture_refused():
    import torch

    from millm.sae.model import SAE

    with pytest.raises(ValueError):
        SAE(torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 2), torch.zeros(2), architecture="gated")
