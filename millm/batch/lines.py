"""OpenAI batch files: one input line as a request, one answer as an output line.

Input lines are ``{"custom_id", "method": "POST", "url": "/v1/...", "body": {...}}``. A line that is not
that (not JSON, an unknown url, a method other than POST) is answered, never skipped: with the status and
OpenAI error body the server would give the same mistake, and an ``error`` object saying the line itself
was refused. Output lines are ``{"id", "custom_id", "response": {"status_code", "request_id", "body",
"headers"}, "error"}``; ``headers`` holds the X-miLLM-* headers the server would have sent.

Ids are derived from the line's number and ``custom_id``, never random, so a rerun, a resumed run and a
Ray run write the same bytes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from millm.errors import InvalidParameter, MillmError

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/embeddings": "embeddings"}


@dataclass(frozen=True)
class BatchLine:
    """One input line: where it is, what it asks, or why the line itself is refused."""

    index: int  # line number in the input file, from 0
    custom_id: Any
    route: str = ""  # "chat", "completions" or "embeddings"
    body: Any = None
    refusal: dict[str, Any] | None = None  # {"status", "body"} for a line refused before any request

    @property
    def key(self) -> str:
        """What resuming matches on: the custom_id as JSON (a line without one is keyed ``null``)."""
        return json.dumps(self.custom_id)

    @property
    def digest(self) -> str:
        return hashlib.sha256(f"{self.index}\0{self.key}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Answer:
    """What the server would have answered one line: status, body and its X-miLLM-* headers."""

    line: BatchLine
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def tokens(self) -> int:
        usage = self.body.get("usage") if self.status == 200 else None
        return int(usage.get("total_tokens", 0)) if isinstance(usage, dict) else 0


def http_refusal(status: int, code: str, message: str) -> dict[str, Any]:
    """The body the server's HTTP error handler writes (unknown route, wrong method)."""
    return {"status": status, "body": {"error": {"message": message, "type": "invalid_request_error",
                                                 "param": None, "code": code}}}


def error_refusal(exc: MillmError) -> dict[str, Any]:
    return {"status": exc.status, "body": exc.body()}


def parse_line(index: int, text: str) -> BatchLine:
    """One input line as a request, or as a refusal naming what is wrong with the line."""
    from millm.requests.jsonbody import decode

    try:
        envelope = decode(text.encode("utf-8", "surrogateescape"))  # bytes as read: bad UTF-8 is refused
    except MillmError as exc:
        return BatchLine(index, None, refusal=error_refusal(exc))
    if not isinstance(envelope, dict):
        return BatchLine(index, None, refusal=error_refusal(InvalidParameter(
            "A batch line must be a JSON object with custom_id, method, url and body.")))
    custom_id = envelope.get("custom_id")
    method, url = envelope.get("method"), envelope.get("url")
    if not isinstance(custom_id, str) or not custom_id:
        return BatchLine(index, custom_id, refusal=error_refusal(InvalidParameter(
            "'custom_id' must be a non-empty string.", param="custom_id")))
    if url not in ROUTES:
        return BatchLine(index, custom_id, refusal=http_refusal(
            404, "not_found", f"miLLM does not serve {method} {url} in a batch; its batch urls are "
                              f"{', '.join(ROUTES)}."))
    if method != "POST":
        return BatchLine(index, custom_id, refusal=http_refusal(
            405, "method_not_allowed", f"{url} takes POST, not {method}."))
    if "body" not in envelope:
        return BatchLine(index, custom_id, refusal=error_refusal(InvalidParameter(
            "The line has no 'body'.", param="body")))
    return BatchLine(index, custom_id, ROUTES[url], envelope["body"])


def parse_lines(lines: list[str]) -> list[BatchLine]:
    """Every non-blank line of an input file, by line number; a custom_id used twice refuses the later line."""
    parsed: list[BatchLine] = []
    seen: dict[str, int] = {}
    for index, text in enumerate(lines):
        if not text.strip():
            continue
        line = parse_line(index, text)
        if line.refusal is None and line.key in seen:
            line = BatchLine(index, line.custom_id, refusal=error_refusal(InvalidParameter(
                f"'custom_id' {line.custom_id!r} is used by line {seen[line.key] + 1} already; custom_ids must be "
                "unique in a batch.", param="custom_id")))
        elif line.refusal is None:
            seen[line.key] = index
        parsed.append(line)
    return parsed


def output_line(answer: Answer) -> str:
    """The output line for one answer (with its newline)."""
    line = answer.line
    error = None
    if line.refusal is not None:
        detail = answer.body["error"]
        error = {"code": detail["code"], "message": detail["message"]}
    out = {"id": f"batch_req_{line.digest}", "custom_id": line.custom_id,
           "response": {"status_code": answer.status, "request_id": f"req_{line.digest}", "body": answer.body,
                        "headers": answer.headers},
           "error": error}
    return json.dumps(out) + "\n"


def to_wire(line: BatchLine) -> str:
    """A parsed line as text, to travel to a Ray worker unchanged (its refusal decided on the driver)."""
    return json.dumps({"index": line.index, "custom_id": line.custom_id, "route": line.route, "body": line.body,
                       "refusal": line.refusal})


def from_wire(text: str) -> BatchLine:
    data = json.loads(text)
    return BatchLine(data["index"], data["custom_id"], data["route"], data["body"], data["refusal"])
