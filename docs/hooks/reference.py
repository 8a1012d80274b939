"""The generated reference pages: the CLI from the Typer app, the HTTP API from the server's OpenAPI document.

A MkDocs hook (``hooks:`` in mkdocs.yml). At build time it walks ``cli.main.app`` (``typer.main.get_command``
and click's help records) into ``reference/cli/*.md`` and renders the checked-in ``docs/reference/openapi.json``
into ``reference/http/*.md``; neither is written by hand, and neither is a file in the repository.

``tests/test_docs_reference.py`` checks that the checked-in OpenAPI document is what the app serves. When a
route or a request body changes, regenerate it:

    python docs/hooks/reference.py --write-openapi
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "docs" / "reference" / "openapi.json"
CLI_INDEX = "reference/cli/index.md"
HTTP_INDEX = "reference/http/index.md"
# the HTTP reference's pages: a path goes to the page that names its first segment after /api (or its first)
HTTP_PAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "index": ("OpenAI routes, health and metrics", ("v1", "metrics", "health", "openapi.json")),
    "steering": ("SAEs and steering", ("saes", "steering", "profiles", "monitoring", "clusters", "circuits", "sweeps",
                                        "measure", "probes", "sensing")),
    "models": ("Models and vectors", ("models", "pulls", "vectors")),
}
METHODS = ("get", "post", "put", "patch", "delete")

log = logging.getLogger("mkdocs.hooks.reference")


# the CLI ------------------------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (no HTML, no column breaks, one line)."""
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _command_section(command: Any, ctx: Any, level: int) -> list[str]:
    """One command: its usage, its help and a table of its arguments and options (click's help records)."""
    lines = [f"{'#' * level} `{ctx.command_path}`", ""]
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    lines += ["```text", usage, "```", ""]
    if command.help:
        lines += [html.escape(command.help.strip(), quote=False), ""]
    rows = []
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None or "--help" in getattr(param, "opts", ()):
            continue
        names, help_text = record  # click's: the help carries [default: ...] and [required]
        rows.append(f"| `{names}` | {_cell(help_text)} |")
    if rows:
        lines += ["| argument or option | what |", "|---|---|", *rows, ""]
    return lines


def _group_commands(group: Any, ctx: Any) -> list[tuple[str, Any, Any]]:
    out = []
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        out.append((name, command, command.context_class(command, info_name=name, parent=ctx)))
    return out


def cli_pages() -> dict[str, str]:
    """``reference/cli/index.md`` (the top-level commands) and one page per command group."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import typer

    from cli.main import app

    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="millm")
    commands = _group_commands(root, ctx)
    groups = [(name, cmd, c) for name, cmd, c in commands if hasattr(cmd, "list_commands")]
    singles = [(name, cmd, c) for name, cmd, c in commands if not hasattr(cmd, "list_commands")]
    index = ["# CLI reference", "",
             "Generated at build time from the Typer app (`cli.main.app`) by `docs/hooks/reference.py`: every "
             "option below is the one `millm ... --help` prints.", "",
             "```text", " ".join(["millm", *root.collect_usage_pieces(ctx)]), "```", "",
             html.escape((root.help or "").strip(), quote=False), "",
             "| command | what |", "|---|---|"]
    for name, cmd, c in commands:
        target = f"{name}.md" if (name, cmd, c) in groups else f"#{_anchor(c.command_path)}"
        index.append(f"| [`millm {name}`]({target}) | {_cell(cmd.get_short_help_str(limit=200))} |")
    index.append("")
    for _, cmd, c in singles:
        index += _command_section(cmd, c, 2)
    pages = {CLI_INDEX: "\n".join(index)}
    for name, group, gctx in groups:
        lines = [f"# `millm {name}`", "", html.escape((group.help or "").strip(), quote=False), "",
                 "| command | what |", "|---|---|"]
        subs = _group_commands(group, gctx)
        for _, cmd, c in subs:
            lines.append(f"| [`{c.command_path}`](#{_anchor(c.command_path)}) | "
                         f"{_cell(cmd.get_short_help_str(limit=200))} |")
        lines.append("")
        for _, cmd, c in subs:
            lines += _command_section(cmd, c, 2)
        pages[f"reference/cli/{name}.md"] = "\n".join(lines)
    return pages


def _anchor(title: str) -> str:
    """The id MkDocs' toc extension gives a heading made of ``title`` in a code span."""
    return "-".join(title.lower().split())


# the HTTP API -------------------------------------------------------------------------------------------------

def _page_of(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    key = parts[1] if parts[:1] == ["api"] and len(parts) > 1 else (parts[0] if parts else "")
    for page, (_, keys) in HTTP_PAGES.items():
        if key in keys:
            return page
    log.warning("reference: %s is on no HTTP reference page; add '%s' to HTTP_PAGES in docs/hooks/reference.py",
                path, key)
    return "index"


def _schema_name(ref: dict[str, Any]) -> str:
    return str(ref.get("$ref", "")).rsplit("/", 1)[-1] or json.dumps(ref)


def _path_table(path: str, ops: dict[str, Any]) -> list[str]:
    lines = [f"### `{path}`", "", "| method | summary | request body | responses |", "|---|---|---|---|"]
    for method in METHODS:
        op = ops.get(method)
        if op is None:
            continue
        body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
        body_cell = f"[`{_schema_name(body)}`](index.md#{_schema_name(body).lower()})" if body else ""
        responses = []
        for status, response in op.get("responses", {}).items():
            schema = response.get("content", {}).get("application/json", {}).get("schema")
            responses.append(f"{status} {response.get('description', '')}".strip()
                             + (f" (`{_schema_name(schema)}`)" if schema else ""))
        lines.append(f"| {method.upper()} | {_cell(op.get('summary', ''))} | {body_cell} | "
                     f"{_cell('; '.join(responses))} |")
    return lines + [""]


def _schema_rows(name: str, schema: dict[str, Any]) -> list[str]:
    props = schema.get("properties", {})
    required = set(schema.get("required", ()))
    fields = ", ".join(f"`{p}`{'*' if p in required else ''}" for p in props) or "(any JSON)"
    return [f"| <span id=\"{name.lower()}\"></span>`{name}` | {fields} |"]


def http_pages(document: dict[str, Any]) -> dict[str, str]:
    """``reference/http/*.md``: a table per path (method, summary, request body schema, responses)."""
    by_page: dict[str, list[str]] = {page: [] for page in HTTP_PAGES}
    for path, ops in document.get("paths", {}).items():
        by_page[_page_of(path)] += _path_table(path, ops)
    info = document.get("info", {})
    pages = {}
    for page, (title, _) in HTTP_PAGES.items():
        head = [f"# HTTP reference: {title}", "",
                f"Generated at build time from the server's own OpenAPI document ({info.get('title')} "
                f"{info.get('version')}, OpenAPI {document.get('openapi')}): `GET /openapi.json`, checked in as "
                "[`docs/reference/openapi.json`](../openapi.json) and checked against the app by "
                "`tests/test_docs_reference.py`.", ""]
        if page == "index":
            head += ["Pages: " + ", ".join(f"[{t}]({p}.md)" for p, (t, _) in HTTP_PAGES.items() if p != "index")
                     + ". What each route does and refuses is in the guides: [serving](../../serving/index.md), "
                     "[steering](../../steering/index.md), [lifecycle](../../lifecycle.md), "
                     "[vectors](../../vectors.md).", ""]
        pages[f"reference/http/{page}.md"] = "\n".join(head + ["## Routes", ""] + by_page[page])
    schemas = document.get("components", {}).get("schemas", {})
    rows = [row for name, schema in schemas.items() for row in _schema_rows(name, schema)]
    pages[HTTP_INDEX] += "\n".join(["", "## Schemas", "",
                                    "Request bodies and the error body; `*` marks a required field. The full "
                                    "schemas are in [`openapi.json`](../openapi.json).", "",
                                    "| schema | fields |", "|---|---|", *rows, ""])
    return pages


# the hook -----------------------------------------------------------------------------------------------------

def generated_pages() -> dict[str, str]:
    return {**cli_pages(), **http_pages(json.loads(OPENAPI.read_text(encoding="utf-8")))}


_PAGES: dict[str, str] = {}


def on_config(config: Any) -> Any:
    """Generate the pages once per build and list them in the nav where ``reference/cli/index.md`` and
    ``reference/http/index.md`` stand."""
    _PAGES.clear()
    _PAGES.update(generated_pages())

    def expand(index: str, prefix: str) -> list[Any]:
        return [index] + [p for p in sorted(_PAGES) if p.startswith(prefix) and p != index]

    def walk(items: list[Any]) -> list[Any]:
        out: list[Any] = []
        for item in items:
            if isinstance(item, dict):
                (title, value), = item.items()
                if value == CLI_INDEX:
                    value = expand(CLI_INDEX, "reference/cli/")
                elif value == HTTP_INDEX:
                    value = expand(HTTP_INDEX, "reference/http/")
                elif isinstance(value, list):
                    value = walk(value)
                out.append({title: value})
            else:
                out.append(item)
        return out

    if config.nav:
        config.nav = walk(config.nav)
    return config


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for src, content in _PAGES.items():
        files.append(File.generated(config, src, content=content))
    return files


# regenerating the checked-in OpenAPI document ---------------------------------------------------------------------

def openapi_document() -> dict[str, Any]:
    """What ``GET /openapi.json`` answers: the document is built from the app's routes alone."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from millm.config import Settings
    from millm.server import openapi
    from millm.server.app import create_app

    with tempfile.TemporaryDirectory(prefix="millm-docs-") as home:
        return openapi.build(create_app(Settings(home=Path(home))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write-openapi", action="store_true", help=f"rewrite {OPENAPI.relative_to(ROOT)}")
    parser.add_argument("--print", dest="show", metavar="PAGE",
                        help="print one generated page (e.g. reference/cli/sae.md)")
    args = parser.parse_args()
    if args.write_openapi:
        OPENAPI.parent.mkdir(parents=True, exist_ok=True)
        OPENAPI.write_text(json.dumps(openapi_document(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"wrote {OPENAPI.relative_to(ROOT)}")
    if args.show:
        print(generated_pages()[args.show])
    if not (args.write_openapi or args.show):
        parser.print_help()


if __name__ == "__main__":
    main()
