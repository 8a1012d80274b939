"""The SQLite store: profiles survive a process killed in the middle of writing them."""

import os
import signal
import subprocess
import sys
import time

from millm.store import Store

WRITER = """
import sys
from pathlib import Path
from millm.store import Store
store = Store(Path(sys.argv[1]))
print("ready", flush=True)
i = 0
while True:
    entries = [{"sae": "sae_x", "feature": f, "strength": float(i)} for f in range(2000)]
    store.save_profile({"name": f"p{i % 5}", "description": str(i), "model": None, "entries": entries},
                       overwrite=True)
    store.set_state("counter", {"i": i, "check": [i] * 500})
    i += 1
"""


def test_profiles_survive_kill_during_write(tmp_path):
    db = tmp_path / "millm.db"
    for delay in (0.3, 0.55, 0.8):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(db)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        store = Store(db)
        profiles = store.profiles()
        assert profiles, "nothing was written before the kill"
        for p in profiles:
            strengths = {e["strength"] for e in p["entries"]}
            assert len(p["entries"]) == 2000 and strengths == {float(p["description"])}  # never half-written
        state = store.get_state("counter")
        assert state["check"] == [state["i"]] * 500
        store.close()


def test_round_trip_and_conflicts(tmp_path):
    store = Store(tmp_path / "db.sqlite")
    doc = {"name": "a", "description": "", "model": None, "entries": [{"sae": "s", "feature": 1, "strength": 2.0}]}
    assert store.save_profile(doc, overwrite=False)
    assert not store.save_profile({**doc, "description": "other"}, overwrite=False)
    assert store.profile("a")["description"] == ""
    assert store.save_profile({**doc, "description": "new"}, overwrite=True)
    assert store.profile("a")["description"] == "new" and store.profile("a")["entries"] == doc["entries"]
    assert store.delete_profile("a") and store.profile("a") is None


def test_a_database_made_before_profile_scopes_opens_with_every_profile_steering_all(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE profiles (name TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '', model TEXT, "
                     "entries TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL)")
        conn.execute("INSERT INTO profiles VALUES ('old', '', NULL, '[]', 1.0, 1.0)")
    store = Store(path)
    assert store.profile("old")["steering_scope"] == "all"
    store.save_profile({"name": "new", "entries": [], "steering_scope": "prompt"}, overwrite=False)
    assert store.profile("new")["steering_scope"] == "prompt"
    assert Store(path).profile("new")["steering_scope"] == "prompt"  # opening it again changes nothing
