"""LEAF's per-user JSON files (Caldas et al. 2018), shared by FEMNIST and Sent140: {"users":
[...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}}. A file that is not in
this shape stops the load with `DataError` naming the file and the user (`who`: "user", "writer")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from . import manifests


def user_entries(path: Path, who: str = "user") -> Iterator[tuple[str, dict]]:
    """(user id, {"x": list, "y": list}) of every user of one LEAF file, in the file's order."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise manifests.DataError(f"{path}: not a readable JSON file ({exc})") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("users"), list)
        or not isinstance(doc.get("user_data"), dict)
    ):
        raise manifests.DataError(
            f"{path}: expected LEAF's format, an object with 'users' (a list) and 'user_data' (an object)"
        )
    for user in doc["users"]:
        entry = doc["user_data"].get(user)
        if not isinstance(entry, dict) or not isinstance(entry.get("x"), list) or not isinstance(entry.get("y"), list):
            raise manifests.DataError(f"{path}: {who} {user!r} has no 'x' and 'y' lists in 'user_data'")
        yield str(user), entry
