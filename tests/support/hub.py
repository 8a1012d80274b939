"""A stand-in for the Hugging Face Hub's HTTP API on loopback (no network): repo info, HEAD and GET on
``/resolve``, and large files redirected to a second host name (as the Hub sends them to its CDN) that honours
Range and can drop a response half-way."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from huggingface_hub import constants

from millm import hub

COMMIT = "1" * 40
LFS = (".safetensors", ".gguf")


@dataclass
class FakeHub:
    """Repos of files at one commit; records every request; ``cut`` drops a file's next responses early."""

    repos: dict[str, dict[str, bytes]] = field(default_factory=dict)
    commit: str = COMMIT
    requests: list[dict[str, str | None]] = field(default_factory=list)
    cut: dict[str, tuple[int, int]] = field(default_factory=dict)  # file -> (bytes sent, times)
    cdn: str = ""  # the CDN's origin: the same handler on another port
    gate: threading.Event | None = None  # when set: the CDN sends half of each file, then waits for it to open

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
            if hub_.gate is not None:
                self.wfile.write(body[:len(body) // 2])
                self.wfile.flush()
                hub_.gate.wait(30)
                body = body[len(body) // 2:]
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


@contextmanager
def hub_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The stand-in Hub holding a checkpoint (``acme/tiny``) and GGUF files (``acme/tiny-GGUF``), pointed at
    through huggingface_hub's constants (read at import, so patched), for the length of the block."""
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
