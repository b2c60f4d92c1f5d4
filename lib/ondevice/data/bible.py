"""The King James Bible as per-user text (user = book, one message per verse), DeepType's far
public corpus: a global model trained on it has never seen the users' kind of text."""

from __future__ import annotations

import json
from pathlib import Path

from . import manifests
from .user_text import Message


def messages(path: Path | None = None) -> list[Message]:
    """Every verse in canonical order (the timestamp is the verse's place in the book list)."""
    path = Path(path or manifests.resolve("bible", "verses"))
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                verse = json.loads(line)
                out.append(Message(verse["book"], float(n), verse["text"]))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise manifests.DataError(f"{path}:{n}: not a verse with 'book' and 'text' ({exc})") from None
    if not out:
        raise manifests.DataError(f"{path}: no verses")
    return out
