"""Storing the sets of a multi-layer learn is all or nothing, whatever stops it (issue 49, item 6): the sets are
staged, moved into place and registered in one registry transaction, so an error or a kill between two sets
leaves none registered, and storing them again works."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from millm.store import Store

D_MODEL = 576


def sets(name: str, layers: list[int]) -> list:
    import torch

    from millm.sae.vector_sets import VectorSet, set_name

    out = []
    for layer in layers:
        v = torch.randn(1, D_MODEL, generator=torch.Generator().manual_seed(layer))
        out.append(VectorSet((set_name(name, layer, layers),), v / v.norm(), layer, "m", "diffmean", "mean",
                             {"positive": 2, "negative": 2}, "abc", {}))
    return out


def registered(home: Path) -> list[str]:
    store = Store(home / "millm.db")
    try:
        return [r["id"] for r in store.saes() if r["format"] == "vectors"]
    finally:
        store.close()


def test_an_error_between_two_sets_registers_none_and_leaves_no_folder(tmp_path, monkeypatch):
    from millm.steering.service import SteeringService
    from millm.vectors import catalog

    service = SteeringService(Store(tmp_path / "millm.db"))
    calls = []
    real = SteeringService.register_sae

    def failing(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 3:
            raise OSError("disk full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SteeringService, "register_sae", failing)
    with pytest.raises(OSError):
        catalog.store_all(service, tmp_path, sets("v", [3, 4, 5, 6]))
    assert len(calls) == 3 and registered(tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "vectors").iterdir()) == []
    monkeypatch.setattr(SteeringService, "register_sae", real)
    records = catalog.store_all(service, tmp_path, sets("v", [3, 4, 5, 6]))
    assert [r["id"] for r in records] == registered(tmp_path) == ["v-L3", "v-L4", "v-L5", "v-L6"]
    assert all((tmp_path / "vectors" / n).is_dir() for n in registered(tmp_path))


KILLED = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from millm.steering.service import SteeringService
    from millm.store import Store
    from millm.vectors import catalog
    from tests.vectors.test_store_all import sets

    home = Path(sys.argv[1])
    real, calls = SteeringService.register_sae, []

    def dying(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == int(sys.argv[2]):
            os._exit(9)  # killed: no cleanup, no rollback but SQLite's own
        return real(self, *args, **kwargs)

    SteeringService.register_sae = dying
    catalog.store_all(SteeringService(Store(home / "millm.db")), home, sets("v", list(range(30))))
""")


@pytest.mark.parametrize("dies_at", [2, 30])
def test_a_learn_killed_while_storing_its_sets_registers_none(tmp_path, dies_at):
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", KILLED, str(tmp_path), str(dies_at)], cwd=root, timeout=120,
                          capture_output=True, text=True)
    assert done.returncode == 9, done.stderr
    assert registered(tmp_path) == []
    from millm.steering.service import SteeringService
    from millm.vectors import catalog

    service = SteeringService(Store(tmp_path / "millm.db"))
    catalog.store_all(service, tmp_path, sets("v", list(range(30))))  # the folders a kill left are replaced
    assert len(registered(tmp_path)) == 30


def test_writes_inside_atomic_land_together_or_not_at_all(tmp_path):
    store = Store(tmp_path / "millm.db")
    with pytest.raises(RuntimeError), store.atomic():
        store.set_state("a", 1)
        store.set_state("b", 2)
        raise RuntimeError("stop")
    assert (store.get_state("a"), store.get_state("b")) == (None, None)
    with store.atomic():
        store.set_state("a", 1)
        with pytest.raises(ValueError), store.atomic():  # a nested block that fails leaves the rest
            store.set_state("b", 2)
            raise ValueError("inner")
        store.set_state("c", 3)
    assert (store.get_state("a"), store.get_state("b"), store.get_state("c")) == (1, None, 3)
