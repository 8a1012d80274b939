"""The SQLite store: registered SAEs and their labels, saved profiles, imported clusters and circuits,
persisted steering state, and the records of background jobs (learning, sweeps, pulls).

Every write is one transaction, so a process killed mid-write leaves the previous state readable; ``atomic``
makes several writes one transaction (a multi-layer learn registers all its sets, or none).
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from millm.config import DEFAULT_DIAL

SCHEMA = """
CREATE TABLE IF NOT EXISTS saes (
    id TEXT PRIMARY KEY, name TEXT NOT NULL, path TEXT NOT NULL, format TEXT NOT NULL,
    architecture TEXT NOT NULL, d_in INTEGER NOT NULL, d_sae INTEGER NOT NULL,
    layer_hint INTEGER, model_hint TEXT, added REAL NOT NULL);
CREATE TABLE IF NOT EXISTS sae_labels (
    sae_id TEXT NOT NULL, feature INTEGER NOT NULL, label TEXT NOT NULL, PRIMARY KEY (sae_id, feature));
CREATE TABLE IF NOT EXISTS profiles (
    name TEXT PRIMARY KEY, description TEXT NOT NULL DEFAULT '', model TEXT, entries TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, scope TEXT NOT NULL DEFAULT 'all');
CREATE TABLE IF NOT EXISTS state (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (
    name TEXT PRIMARY KEY, document TEXT NOT NULL, intensity REAL NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS circuits (name TEXT PRIMARY KEY, document TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, created REAL NOT NULL, active INTEGER NOT NULL, owner TEXT NOT NULL,
    record TEXT NOT NULL);
"""

SAE_COLUMNS = ("id", "name", "path", "format", "architecture", "d_in", "d_sae", "layer_hint", "model_hint")
DOCUMENT_TABLES = {"cluster": "clusters", "circuit": "circuits"}
ACTIVE_CIRCUIT = "active_circuit"  # the state key naming the active circuit


def _profile_row(verb: str, profile: dict[str, Any], created: float, updated: float) -> tuple[str, tuple[Any, ...]]:
    """The statement that writes ``profile``'s row (``verb``: INSERT OR IGNORE / OR REPLACE)."""
    return (f"{verb} INTO profiles (name, description, model, entries, created, updated, scope) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (profile["name"], profile.get("description") or "", profile.get("model"), json.dumps(profile["entries"]),
             created, updated, profile.get("steering_scope") or "all"))


class Store:
    """One SQLite database file; safe to share between threads of one process and between processes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()  # re-entered by the writes inside ``atomic``
        self._depth = 0  # open transactions on the holding thread (``atomic`` nests the writes inside it)
        with self._lock:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.executescript(SCHEMA)
            columns = {row["name"] for row in self._conn.execute("PRAGMA table_info(profiles)")}
            if "scope" not in columns:  # a database made before profiles had a steering scope
                self._conn.execute("ALTER TABLE profiles ADD COLUMN scope TEXT NOT NULL DEFAULT 'all'")

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (reads inside it see a stable database): all of it lands, or none. Inside
        ``atomic`` (on its thread) it is part of that transaction; other threads wait for it to end, so none
        reads what it has not committed."""
        with self._lock:
            if self._depth:  # nested: a savepoint, so a write that fails inside leaves the rest of the block
                point = f"nested_{self._depth}"
                self._conn.execute(f"SAVEPOINT {point}")
                self._depth += 1
                try:
                    yield self._conn
                    self._conn.execute(f"RELEASE {point}")
                except BaseException:
                    self._conn.execute(f"ROLLBACK TO {point}")
                    self._conn.execute(f"RELEASE {point}")
                    raise
                finally:
                    self._depth -= 1
                return
            self._conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield self._conn
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """Every write this thread makes inside the block lands in one transaction, or none does (an error, or
        the process killed before the block ends, leaves the database as it was)."""
        with self._transaction():
            yield

    def _write(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        """Run ``statements`` as one transaction: all of them land, or none."""
        with self._transaction() as conn:
            for sql, args in statements:
                conn.execute(sql, args)

    def _rows(self, sql: str, args: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, args).fetchall()

    # SAEs
    def add_sae(self, record: dict[str, Any], labels: dict[int, str]) -> None:
        cols = ", ".join(SAE_COLUMNS) + ", added"
        marks = ", ".join("?" for _ in SAE_COLUMNS) + ", ?"
        statements = [(f"INSERT OR REPLACE INTO saes ({cols}) VALUES ({marks})",
                       (*(record[c] for c in SAE_COLUMNS), time.time())),
                      ("DELETE FROM sae_labels WHERE sae_id = ?", (record["id"],))]
        statements += [("INSERT INTO sae_labels VALUES (?, ?, ?)", (record["id"], f, lab)) for f, lab in labels.items()]
        self._write(statements)

    def saes(self) -> list[dict[str, Any]]:
        return [dict(r) for r in self._rows("SELECT * FROM saes ORDER BY added")]

    def sae(self, sae_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM saes WHERE id = ?", (sae_id,))
        return dict(rows[0]) if rows else None

    def delete_sae(self, sae_id: str) -> None:
        self._write([("DELETE FROM saes WHERE id = ?", (sae_id,)),
                     ("DELETE FROM sae_labels WHERE sae_id = ?", (sae_id,))])

    def labels(self, sae_id: str, query: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        sql, args = "SELECT feature, label FROM sae_labels WHERE sae_id = ?", [sae_id]
        if query:
            sql += " AND label LIKE ?"
            args.append(f"%{query}%")
        rows = self._rows(sql + " ORDER BY feature LIMIT ?", (*args, limit))
        return [{"index": r["feature"], "label": r["label"]} for r in rows]

    def label_map(self, sae_id: str) -> dict[int, str]:
        """Every registered label of an SAE, by feature index."""
        rows = self._rows("SELECT feature, label FROM sae_labels WHERE sae_id = ?", (sae_id,))
        return {int(r["feature"]): str(r["label"]) for r in rows}

    def label(self, sae_id: str, feature: int) -> str | None:
        """One feature's registered label (None when it has none)."""
        rows = self._rows("SELECT label FROM sae_labels WHERE sae_id = ? AND feature = ?", (sae_id, feature))
        return str(rows[0]["label"]) if rows else None

    # profiles
    def save_profile(self, profile: dict[str, Any], *, overwrite: bool) -> bool:
        """Insert (or replace when ``overwrite``); False when the name exists and overwrite is off."""
        now = time.time()
        verb = "INSERT OR REPLACE" if overwrite else "INSERT OR IGNORE"
        before = self.profile(profile["name"])
        created = before["created"] if before else now
        self._write([_profile_row(verb, profile, created, now)])
        return overwrite or before is None

    def profile(self, name: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM profiles WHERE name = ?", (name,))
        return self._profile_dict(rows[0]) if rows else None

    def profiles(self) -> list[dict[str, Any]]:
        return [self._profile_dict(r) for r in self._rows("SELECT * FROM profiles ORDER BY name")]

    def delete_profile(self, name: str) -> bool:
        exists = self.profile(name) is not None
        self._write([("DELETE FROM profiles WHERE name = ?", (name,))])
        return exists

    @staticmethod
    def _profile_dict(row: sqlite3.Row) -> dict[str, Any]:
        return {"name": row["name"], "description": row["description"], "model": row["model"],
                "entries": json.loads(row["entries"]), "steering_scope": row["scope"], "created": row["created"],
                "updated": row["updated"]}

    # imported clusters and circuits, each backing a profile of its name
    def import_document(self, kind: Literal["cluster", "circuit"], document: dict[str, Any],
                        profile: dict[str, Any], *, overwrite: bool) -> bool:
        """Store a checked document and the profile backed by it, in one transaction.

        False (nothing written) when a profile, cluster or circuit has the name and ``overwrite`` is off.
        Overwriting replaces whatever held the name; a re-imported cluster's dial starts at the default again.
        """
        name, now = document["name"], time.time()
        with self._transaction() as conn:
            taken = conn.execute("SELECT 1 FROM profiles WHERE name = ? UNION ALL SELECT 1 FROM clusters "
                                 "WHERE name = ? UNION ALL SELECT 1 FROM circuits WHERE name = ?",
                                 (name, name, name)).fetchall()
            if taken and not overwrite:
                return False
            self._drop_document(conn, name)
            conn.execute(*_profile_row("INSERT OR REPLACE", profile, now, now))
            if kind == "cluster":
                conn.execute("INSERT INTO clusters VALUES (?, ?, ?, ?)",
                             (name, json.dumps(document), DEFAULT_DIAL, now))
            else:
                conn.execute("INSERT INTO circuits VALUES (?, ?, ?)", (name, json.dumps(document), now))
        return True

    @staticmethod
    def _drop_document(conn: sqlite3.Connection, name: str) -> None:
        """Inside a transaction: remove whatever holds ``name`` (cluster, circuit, profile, the active mark)."""
        for table in DOCUMENT_TABLES.values():
            conn.execute(f"DELETE FROM {table} WHERE name = ?", (name,))
        conn.execute("DELETE FROM profiles WHERE name = ?", (name,))
        conn.execute("DELETE FROM state WHERE key = ? AND value = ?", (ACTIVE_CIRCUIT, json.dumps(name)))

    def documents(self, kind: Literal["cluster", "circuit"]) -> list[dict[str, Any]]:
        """Every imported cluster (or circuit): ``{"name", "document", "created"}``, clusters with ``intensity``."""
        return [self._document_dict(r) for r in self._rows(f"SELECT * FROM {DOCUMENT_TABLES[kind]} ORDER BY name")]

    def document(self, kind: Literal["cluster", "circuit"], name: str) -> dict[str, Any] | None:
        rows = self._rows(f"SELECT * FROM {DOCUMENT_TABLES[kind]} WHERE name = ?", (name,))
        return self._document_dict(rows[0]) if rows else None

    def backing(self, name: str) -> Literal["cluster", "circuit"] | None:
        """What the profile ``name`` is backed by: an imported cluster, a circuit, or nothing (a plain profile)."""
        for kind in ("cluster", "circuit"):
            if self._rows(f"SELECT 1 FROM {DOCUMENT_TABLES[kind]} WHERE name = ?", (name,)):
                return kind
        return None

    def delete_document(self, kind: Literal["cluster", "circuit"], name: str) -> bool:
        """Remove a cluster (or circuit) with its profile, in one transaction; False when there is none."""
        with self._transaction() as conn:
            if not conn.execute(f"SELECT 1 FROM {DOCUMENT_TABLES[kind]} WHERE name = ?", (name,)).fetchall():
                return False
            self._drop_document(conn, name)
            return True

    def set_cluster_intensity(self, name: str, lam: float) -> bool:
        """Set a cluster's persistent dial (already checked against its bounds); False when there is no cluster."""
        with self._transaction() as conn:
            return conn.execute("UPDATE clusters SET intensity = ? WHERE name = ?", (lam, name)).rowcount > 0

    def set_active_circuit(self, name: str | None) -> bool:
        """Make ``name`` the active circuit (None: none is); False when there is no such circuit."""
        with self._transaction() as conn:
            if name is None:
                conn.execute("DELETE FROM state WHERE key = ?", (ACTIVE_CIRCUIT,))
                return True
            if not conn.execute("SELECT 1 FROM circuits WHERE name = ?", (name,)).fetchall():
                return False
            conn.execute("INSERT OR REPLACE INTO state VALUES (?, ?)", (ACTIVE_CIRCUIT, json.dumps(name)))
            return True

    def active_circuit(self) -> str | None:
        name: str | None = self.get_state(ACTIVE_CIRCUIT)
        return name

    @staticmethod
    def _document_dict(row: sqlite3.Row) -> dict[str, Any]:
        out = {"name": row["name"], "document": json.loads(row["document"]), "created": row["created"]}
        if "intensity" in row.keys():
            out["intensity"] = row["intensity"]
        return out

    # background job records (millm.server.jobs), kept across restarts
    def save_job(self, job_id: str, kind: str, created: float, active: bool, owner: str,
                 record: dict[str, Any]) -> None:
        """Write (or rewrite) a job's record; ``owner`` names the process running it while ``active``."""
        self._write([("INSERT OR REPLACE INTO jobs (id, kind, created, active, owner, record) "
                      "VALUES (?, ?, ?, ?, ?, ?)", (job_id, kind, created, int(active), owner, json.dumps(record)))])

    def jobs(self, kind: str) -> list[dict[str, Any]]:
        """Every ``kind`` job record, oldest first: ``{"id", "created", "active", "owner", "record"}``."""
        rows = self._rows("SELECT * FROM jobs WHERE kind = ? ORDER BY created, rowid", (kind,))
        return [{"id": r["id"], "created": r["created"], "active": bool(r["active"]), "owner": r["owner"],
                 "record": json.loads(r["record"])} for r in rows]

    def prune_jobs(self, kind: str, keep: int) -> None:
        """Delete the oldest ended ``kind`` jobs past the newest ``keep`` (an active one is never deleted)."""
        self._write([("DELETE FROM jobs WHERE kind = ? AND active = 0 AND id NOT IN (SELECT id FROM jobs WHERE "
                      "kind = ? ORDER BY created DESC, rowid DESC LIMIT ?)", (kind, kind, keep))])

    # persisted state (steering, active profile, monitoring)
    def get_state(self, key: str, default: Any = None) -> Any:
        rows = self._rows("SELECT value FROM state WHERE key = ?", (key,))
        return json.loads(rows[0]["value"]) if rows else default

    def set_state(self, key: str, value: Any) -> None:
        self._write([("INSERT OR REPLACE INTO state VALUES (?, ?)", (key, json.dumps(value)))])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
