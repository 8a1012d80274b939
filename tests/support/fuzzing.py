"""Fuzzing a live server from its own /openapi.json with schemathesis: the driver the test suite and
bench/fuzz.py share.

Every operation gets schema-valid (positive) and schema-violating (negative) requests. The properties: no
5xx except the spec's typed ones, every error body in OpenAI's shape, and the server still answers
/api/health afterwards. Generation is kept short (max_tokens at most ``MAX_TOKENS``) so a run measures the
request handling, not decoding.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.core.result import Ok

from millm.server.auth import READ_METHODS, is_loopback
from tests.support import malformed
from tests.support.hostile import MAX_TOKENS, hostile_bodies

# the spec's typed 5xx: a server-side condition a client can act on, never a crash
TYPED_5XX = {"model_not_loaded", "model_busy", "queue_full", "insufficient_memory", "model_load_failed",
             "non_finite_logits", "constrained_output_invalid"}
GENERATING = ("/v1/chat/completions", "/v1/completions")


@dataclass
class Report:
    """What a run sent and what broke a property (one line per problem, with the request that caused it)."""

    sent: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)


def problem_of(status: int, content_type: str, text: str) -> str | None:
    """Why a response breaks a property, or None."""
    if status < 400:
        return None
    try:
        body = httpx.Response(status, text=text).json()
    except ValueError:
        return f"{status}: the error body is not JSON ({content_type}): {text[:200]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not (
            set(error) == {"message", "type", "param", "code"} and isinstance(error["message"], str)
            and isinstance(error["type"], str) and isinstance(error["param"], (str, type(None)))
            and isinstance(error["code"], (str, type(None)))):
        return f"{status}: the error body is not OpenAI's shape: {text[:200]!r}"
    if status >= 500 and error["code"] not in TYPED_5XX:
        return f"{status} {error['code']}: {error['message'][:300]}"
    return None


def short(case: Any) -> Any:
    """A generating request asks for at most MAX_TOKENS tokens (the fuzz is of the request, not the decode)."""
    if case.path in GENERATING and isinstance(case.body, dict):
        for name in ("max_tokens", "max_completion_tokens"):
            value = case.body.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
                case.body[name] = MAX_TOKENS
        if "max_tokens" not in case.body and "max_completion_tokens" not in case.body:
            case.body["max_tokens"] = MAX_TOKENS
    return case


def operations(base: str, skip: tuple[str, ...] = ()) -> list[Any]:
    """The server's operations from its /openapi.json, less any whose path starts with one in ``skip``."""
    schema = schemathesis.openapi.from_dict(httpx.get(base + "/openapi.json", timeout=30).json())
    ops = [result.ok() for result in schema.get_all_operations() if isinstance(result, Ok)]
    return [op for op in ops if not op.path.startswith(skip)]


def fuzz_operation(base: str, op: Any, examples: int, report: Report, seed: int = 0) -> None:
    """``examples`` positive and ``examples`` negative requests to one operation, recorded in ``report``."""
    with requests.Session() as session:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_mode(base, op, mode, examples, report, seed, session)


def _fuzz_mode(base: str, op: Any, mode: GenerationMode, examples: int, report: Report, seed: int,
               session: requests.Session) -> None:
    label = f"{op.method.upper()} {op.path}"

    @settings(max_examples=examples, deadline=None, database=None, derandomize=seed == 0,
              suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
    @given(case=op.as_strategy(generation_mode=mode).map(short))
    def send(case: Any) -> None:
        with session.request(**case.as_transport_kwargs(base_url=base), timeout=300, stream=True) as response:
            kind = str(response.headers.get("content-type", ""))
            # a server-sent events stream runs until its client leaves: its first event is what is checked
            text = (next(response.iter_content(4096, decode_unicode=True), "") if kind.startswith("text/event-stream")
                    else response.text)
        report.sent[label] += 1
        report.statuses[response.status_code] += 1
        found = problem_of(response.status_code, kind, text)
        if found is not None:
            report.problems.append(f"{label} [{mode.value}] {found}; body: {str(case.body)[:300]}")

    try:
        send()
    except Exception as exc:  # the fuzzer's own failure (not the server's) is reported, not raised
        if "Unsatisfiable" not in type(exc).__name__:
            report.problems.append(f"{label} [{mode.value}] the fuzzer failed: {type(exc).__name__}: {exc}")


def send_hostile(base: str, report: Report) -> None:
    """The hand-made hostile schemas, through the same properties as the generated requests."""
    model = httpx.get(base + "/v1/models", timeout=30).json()["data"][0]["id"]
    for label, body, _ in hostile_bodies(model):
        response = httpx.post(base + "/v1/chat/completions", json=body, timeout=300)
        report.sent[f"hostile {label}"] += 1
        report.statuses[response.status_code] += 1
        found = problem_of(response.status_code, response.headers.get("content-type", ""), response.text)
        if found is not None:
            report.problems.append(f"hostile {label}: {found}")


def cross_site(base: str) -> list[tuple[str, str, dict[str, str], bytes, int]]:
    """What a web page of another site can send to every operation, and the status each must get: a rebound
    name as ``Host`` (421, when the server is reached on loopback), another ``Origin`` on a state-changing
    method (403), a body that is not said to be JSON (415). Path parameters are placeholders: the rules are
    checked before routing."""
    netloc = httpx.URL(base).netloc.decode()
    port = netloc.rsplit(":", 1)[1] if ":" in netloc.rsplit("]", 1)[-1] else ""
    loopback = is_loopback(httpx.URL(base).host)
    cases = []
    for op in operations(base):
        method, path = op.method.upper(), re.sub(r"{[^}]+}", "x", op.path)
        if loopback:
            cases.append((method, path, {"Host": f"rebound.example:{port}"}, b"", 421))
        if method not in READ_METHODS:
            cases.append((method, path, {"Origin": "http://evil.example", "Content-Type": "application/json"},
                          b"{}", 403))
            cases.append((method, path, {"Origin": "null", "Content-Type": "application/json"}, b"{}", 403))
            for kind in ("text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data"):
                cases.append((method, path, {"Content-Type": kind}, b"{}", 415))
    return cases


def send_cross_site(base: str, report: Report) -> None:
    """The web page's requests (``cross_site``), each of which must get exactly its refusal in OpenAI's shape."""
    with httpx.Client(base_url=base, timeout=60) as client:
        for method, path, headers, body, expected in cross_site(base):
            response = client.request(method, path, headers=headers, content=body)
            label = f"cross-site {expected}"
            report.sent[label] += 1
            report.statuses[response.status_code] += 1
            found = problem_of(response.status_code, response.headers.get("content-type", ""), response.text)
            if response.status_code != expected:
                found = f"{response.status_code} where {expected} was due: {response.text[:200]!r}"
            if found is not None:
                report.problems.append(f"{label} {method} {path} {headers}: {found}")


IMPORTED = "fuzz-import"  # the name every malformed import asks for: none may be stored under it


def import_cases(scratch: Path) -> list[tuple[str, Path]]:
    """Every malformed vector-set folder and control-vector file of ``tests.support.malformed``, written under
    ``scratch``, with its label."""
    cases = []
    for label, (write, *_) in malformed.FOLDERS.items():
        cases.append((f"folder {label}", write(scratch / f"folder-{label}")))
    for label, (tensors, _) in malformed.GGUFS.items():
        cases.append((f"gguf {label}", malformed.gguf_file(scratch / f"{label}.gguf", tensors)))
    cases.append(("gguf empty strings", malformed.empty_strings_gguf(scratch / "empty-strings.gguf")))
    cases.append(("gguf 2^62 keys", malformed.huge_count_gguf(scratch / "huge-count.gguf")))
    return cases


def send_imports(base: str, report: Report) -> None:
    """POST /api/vectors/import with each malformed set: each a 400 in OpenAI's shape, none stored."""
    with tempfile.TemporaryDirectory(prefix="millm-fuzz-imports-") as scratch, \
            httpx.Client(base_url=base, timeout=120) as client:
        for label, path in import_cases(Path(scratch)):
            response = client.post("/api/vectors/import", json={"path": str(path), "name": IMPORTED})
            report.sent[f"import {label}"] += 1
            report.statuses[response.status_code] += 1
            found = problem_of(response.status_code, response.headers.get("content-type", ""), response.text)
            if response.status_code != 400:
                found = f"{response.status_code} where 400 was due: {response.text[:200]!r}"
            if found is not None:
                report.problems.append(f"import {label}: {found}")
        listed = client.get("/api/vectors").json().get("data", [])
        if any(item.get("name") == IMPORTED or item.get("id") == IMPORTED for item in listed):
            report.problems.append(f"a malformed import was stored as '{IMPORTED}'")


def fuzz(base: str, examples: int, skip: tuple[str, ...] = (), seed: int = 0) -> Report:
    """Fuzz every operation of the server at ``base``, then send it a web page's requests and malformed vector
    imports; then check it still answers /api/health."""
    report = Report()
    for op in operations(base, skip):
        fuzz_operation(base, op, examples, report, seed)
    if not any("/v1/chat/completions".startswith(s) for s in skip):
        send_hostile(base, report)
    send_cross_site(base, report)
    if not any("/api/vectors/import".startswith(s) for s in skip):
        send_imports(base, report)
    health = httpx.get(base + "/api/health", timeout=30)
    if health.status_code != 200:
        report.problems.append(f"/api/health answers {health.status_code} after the run")
    return report
