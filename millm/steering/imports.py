"""Importing a cluster or circuit document: check it, then store it with its backing profile, all or nothing.

One path for POST /api/clusters/import, POST /api/circuits/import and ``millm clusters|circuits import``.
"""

from __future__ import annotations

from typing import Any, Literal

from millm.errors import ProfileConflict
from millm.steering.documents import (
    ClusterDoc,
    Document,
    Registered,
    parse_circuit,
    parse_cluster,
    parse_shape,
    profile_for,
    stored_form,
)
from millm.store import Store


def import_document(store: Store, kind: Literal["cluster", "circuit"], raw: Any, registered: Registered, *,
                    overwrite: bool = False) -> Document:
    """Check ``raw`` as a ``kind`` document against what is registered, and store it with its profile.

    A bad document is a 400 naming its JSON pointer and writes nothing; a name already held by a
    profile, cluster or circuit is a 409 unless ``overwrite``.
    """
    doc: Document = parse_cluster(raw, registered) if kind == "cluster" else parse_circuit(raw, registered)
    if overwrite and kind != "cluster" and store.backing(doc.name) == "cluster":
        users = fallback_users(store, doc.name)
        if users:  # overwriting would delete a cluster these circuits serve through
            raise ProfileConflict(f"'{doc.name}' is a cluster that circuit(s) {', '.join(repr(u) for u in users)} "
                                  "use as fallback_cluster; importing a circuit over it would delete it. Import "
                                  "under another name, or change or delete those circuits first.", param="name")
    if not store.import_document(kind, stored_form(doc), profile_for(doc), overwrite=overwrite):
        raise ProfileConflict(f"'{doc.name}' is already a profile, cluster or circuit; import with overwrite "
                              "to replace it.", param="name")
    return doc


def stored_cluster(store: Store, name: str) -> tuple[ClusterDoc, float] | None:
    """An imported cluster's document and persistent dial, or None when there is no such cluster."""
    row = store.document("cluster", name)
    if row is None:
        return None
    return parse_shape("cluster", row["document"], stored=True), float(row["intensity"])


def fallback_users(store: Store, cluster: str) -> list[str]:
    """The imported circuits whose stored document names ``cluster`` as its fallback_cluster."""
    return sorted(row["name"] for row in store.documents("circuit")
                  if isinstance(row["document"], dict) and row["document"].get("fallback_cluster") == cluster)
