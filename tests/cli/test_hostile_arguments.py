"""Every ``millm`` command given hostile arguments answers with a clear line and a non-zero exit, never a
traceback (fast tier: the scripted engine stands in for the bundled model, and nothing loads weights).

The sweep gives each parameter of each command, one at a time, values that broke commands before: text that
is not UTF-8 (how undecodable argv bytes reach Python), ``~nosuchuser`` paths, integers past 64 bits,
negative and non-finite numbers, and folders that do not exist. The named cases below check that the
message names what was wrong.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from cli.main import app
from millm import local
from millm.errors import ModelLoadFailed
from millm.registry import BUNDLED_ID
from tests.support.fakes import FakeEngine

SKIPPED = {"serve", "tui", "models pull"}  # they serve or reach the network; their arguments are Typer's
NOT_UTF8 = "caf\udce9"  # b"caf\xe9" (Latin-1) as Python decodes an argv byte that is not UTF-8
HOSTILE: dict[str, list[str]] = {  # by the parameter's type, as Typer names it
    "str": [NOT_UTF8, "~nosuchuser/x"],
    "int": ["18446744073709551616", "-1"],
    "float": ["nan", "1e400"],
    "Path": ["~nosuchuser/x", "/no/such/folder/file.json"],
}
BENIGN = {"sae": "smollm2-135m-res-L10", "feature": "3", "text": "hello", "prompt": "hello", "name": "nonesuch",
          "layer": "10"}


def commands(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf command of a Typer group, with its path of names (``steer sweep``)."""
    for name, command in sorted(group.commands.items()):
        path = f"{prefix} {name}".strip()
        if hasattr(command, "commands"):
            yield from commands(command, path)
        elif path not in SKIPPED:
            yield path, command


def benign(param: Any, tmp: Path) -> str:
    if param.bare_type() == "Path":
        file = tmp / "doc.json"
        file.write_text("{}")
        return str(file)
    return BENIGN.get(param.name, "1" if param.bare_type() in ("int", "float") else "x")


def invocations(tmp: Path) -> Iterator[list[str]]:
    """Each command once per hostile value of each of its parameters, the others left out (options) or benign
    (required arguments)."""
    for path, command in commands(typer.main.get_command(app)):
        params = [p for p in command.params if not getattr(p, "is_flag", False) and p.bare_type() in HOSTILE]
        required = [p for p in command.params if p.param_type_name == "argument" and p.required]
        for target in params:
            for value in HOSTILE[target.bare_type()]:
                argv = path.split()
                if target.param_type_name == "option":
                    argv += [target.opts[0], value]
                arguments = required + ([target] if target.param_type_name == "argument" and not target.required
                                        else [])
                argv += [value if p is target else benign(p, tmp) for p in arguments]
                yield argv


@pytest.fixture
def scripted(monkeypatch, tmp_path):
    """The scripted engine for the default model; anything that would load weights is refused instead."""
    monkeypatch.setitem(local.ENGINES, BUNDLED_ID, FakeEngine(BUNDLED_ID))

    def no_weights(*_: Any, **__: Any) -> Any:
        raise ModelLoadFailed("this test loads no weights")

    monkeypatch.setattr("millm.engine.loader.load", no_weights)  # torch: imported when the test runs
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def test_every_command_refuses_hostile_arguments_without_a_traceback(scripted, tmp_path):
    ran, failures = 0, []
    for argv in invocations(tmp_path):
        result = scripted.invoke(app, argv, input="")
        ran += 1
        output = result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            failures.append(f"{' '.join(argv)!r}: {type(result.exception).__name__}: {result.exception}")
        elif "Traceback" in output:
            failures.append(f"{' '.join(argv)!r}: a traceback was printed")
    assert ran > 200, ran
    assert not failures, "\n".join(failures)


def run(runner: CliRunner, *argv: str, stdin: bytes | str = "") -> tuple[int, str]:
    result = runner.invoke(app, list(argv), input=stdin)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("argv,says", [
    (["sae", "read", "smollm2-135m-res-L10", NOT_UTF8], "'text' holds bytes that are not UTF-8"),
    (["sae", "read", "smollm2-135m-res-L10", "hi", "--features", "²"], "'²'"),
    (["steer", "sweep", "3", "--seed", str(2**64)], "'seed' must be between 0 and 4294967295"),
    (["steer", "screen", "--seed", "-1"], "'seed' must be between 0"),
    (["steer", "sweep", "3", "--out", "/no/such/folder/plot.png"], "the folder /no/such/folder does not exist"),
    (["steer", "sweep", "3", "--sae", "~nosuchuser/x"], "~nosuchuser/x"),
    (["steer", "sweep", "--sae", "smollm2-135m-res-L10", "--", "-5"], "outside"),
    (["chat", "--sae", "smollm2-135m-res-L10", "--steer", "-5=40", "hi"], "outside"),
])
def test_named_hostile_arguments_say_what_was_wrong(scripted, argv, says):
    code, output = run(scripted, *argv)
    assert code != 0 and says in output and "Traceback" not in output, output


def test_stdin_that_is_not_utf8_is_refused_naming_it(scripted):
    code, output = run(scripted, "sae", "read", "smollm2-135m-res-L10", "-", stdin=b"caf\xe9")
    assert code == 1 and "'text' from standard input is not UTF-8" in output


