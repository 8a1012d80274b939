"""`millm --help` answers at once: the CLI's import imports no heavy library."""

import subprocess
import sys

HEAVY = ("torch", "transformers", "textual", "ray", "llama_cpp")


def test_the_cli_starts_without_heavy_imports():
    code = f"import sys, cli.main; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == ""


def test_batch_and_the_tui_import_neither_the_server_nor_the_cli():
    code = ("import sys, millm.batch.answer, millm.batch.run, tui.local; "
            "print(','.join(sorted({m.split('.')[0] if not m.startswith('millm.') else '.'.join(m.split('.')[:2]) "
            "for m in sys.modules if m == 'quart' or m == 'cli' or m.startswith(('cli.', 'millm.server'))})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert out.stdout.strip() == ""
