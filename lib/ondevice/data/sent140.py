"""LEAF Sent140 (data_manifests/sent140.yaml): tweets grouped by Twitter user, AutLearn's public
text corpus. A LEAF JSON file is {"users": [...], "num_samples": [...], "user_data": {user: {"x":
[[tweet_id, date, query, user, text, split], ...], "y": [0/1, ...]}}}; only the text is used here
(the sentiment label is checked, not kept). Anything else stops the load with `DataError` naming
the file and the user or key that is wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

from . import leaf, manifests
from .user_text import Message

_MENTION_OR_URL = re.compile(r"@\w+|https?://\S+|www\.\S+")


def clean(text: str) -> str:
    """A tweet without @mentions and links (neither is a word anyone types for a prediction)."""
    return _MENTION_OR_URL.sub(" ", text)


def read_file(path: str | Path) -> dict[str, list[str]]:
    """User -> the texts of their tweets in file order, from one LEAF Sent140 JSON file."""
    path = Path(path)
    out = {}
    for user, entry in leaf.user_entries(path, "user"):
        if len(entry["x"]) != len(entry["y"]):
            raise manifests.DataError(
                f"{path}: user {user!r} has {len(entry['x'])} tweets but {len(entry['y'])} labels"
            )
        texts = []
        for i, row in enumerate(entry["x"]):
            if not isinstance(row, list) or len(row) < 5 or not isinstance(row[4], str):
                raise manifests.DataError(
                    f"{path}: user {user!r}, tweet {i}: expected [id, date, query, user, text, ...], got {row!r:.80}"
                )
            texts.append(row[4])
        if any(y not in (0, 1, 0.0, 1.0) for y in entry["y"]):
            raise manifests.DataError(f"{path}: user {user!r} has a label other than 0 or 1")
        out[str(user)] = texts
    if not out:
        raise manifests.DataError(f"{path}: no users")
    return out


def load(directory: str | Path = "") -> tuple[dict[str, list[str]], list[Path]]:
    """User -> tweet texts from every *.json file under `directory` (LEAF's output, e.g. the full
    Sent140 at paper scale), or from the manifest's files (mirror or sources, sha256-verified) when
    it is empty; and the files read. A user in several files keeps all their tweets, in file order."""
    if directory:
        files = sorted(Path(directory).rglob("*.json"))
        if not files:
            raise manifests.DataError(f"no LEAF Sent140 *.json files under {directory}")
    else:
        m = manifests.load("sent140")
        files = [manifests.fetch_artifact(m, a) for a in m.artifacts]
    users: dict[str, list[str]] = {}
    for f in files:
        for user, texts in read_file(f).items():
            users.setdefault(user, []).extend(texts)
    return users, files


def messages(directory: str | Path = "") -> list[Message]:
    """Every tweet without @mentions and links as per-user text (`load`'s users in name order, each
    tweet's place in its user's list as the timestamp): DeepType's public Twitter corpus."""
    users = load(directory)[0]
    return [Message(u, float(i), clean(t)) for u in sorted(users) for i, t in enumerate(users[u])]
