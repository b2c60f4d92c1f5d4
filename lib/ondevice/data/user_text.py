"""Per-user typed text, the one format every text notebook reads (bring your own keyboard logs).

A file is JSON Lines, one typed message per line:

    {"user": "alice", "timestamp": 1700000000.5, "text": "see you at eight"}

- `user`: a non-empty string; `text`: a string (may be empty); `timestamp`: a number (e.g. Unix
  seconds) or an ISO 8601 string ("2024-05-01T12:00:00Z"; without a zone it is read as UTC).
  Other keys are ignored. Blank lines are skipped.
- A line that is not such an object stops the load with `DataError` naming the file and line.
- A user's history is their messages in timestamp order: a stable sort, so messages with equal
  timestamps (duplicates included) keep their file order, and a file need not be sorted. Every
  message counts, repeated ones too.
- Every user in the file is kept, also one whose text has no words (an empty history): nothing is
  dropped silently; which users have enough text for a role is the split's decision.

Shakespeare's roles and the Bible's books are loaded into the same `Message` type.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

from .manifests import DataError
from .typing_samples import sentences


@dataclass(frozen=True)
class Message:
    user: str
    timestamp: float
    text: str


def _timestamp(value) -> float:
    if isinstance(value, bool):
        raise ValueError("a boolean is not a timestamp")
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"timestamp {value!r} is not finite")
        return float(value)
    if isinstance(value, str):
        stamp = datetime.fromisoformat(value.replace("Z", "+00:00"))
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=timezone.utc)
        return stamp.timestamp()
    raise ValueError(f"timestamp must be a number or an ISO 8601 string, got {type(value).__name__}")


def parse_line(line: str, where: str) -> Message:
    """One message from one line; `DataError` naming `where` (file:line) when it is malformed."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with user, timestamp and text, got {type(obj).__name__}")
    missing = [k for k in ("user", "timestamp", "text") if k not in obj]
    if missing:
        raise DataError(f"{where}: missing key(s) {missing}")
    if not isinstance(obj["user"], str) or not obj["user"].strip():
        raise DataError(f"{where}: 'user' must be a non-empty string, got {obj['user']!r}")
    if not isinstance(obj["text"], str):
        raise DataError(f"{where}: 'text' must be a string, got {type(obj['text']).__name__}")
    try:
        stamp = _timestamp(obj["timestamp"])
    except ValueError as exc:
        raise DataError(f"{where}: bad 'timestamp' {obj['timestamp']!r} ({exc})") from None
    return Message(obj["user"], stamp, obj["text"])


def read(path: str | Path) -> list[Message]:
    """Every message of a JSON Lines file, in file order."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"no per-user text file at {path}")
    out = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                out.append(parse_line(line, f"{path}:{n}"))
    if not out:
        raise DataError(f"{path}: no messages")
    return out


def write(messages: Iterable[Message], path: str | Path) -> None:
    with Path(path).open("w", encoding="utf-8") as f:
        for m in messages:
            f.write(json.dumps({"user": m.user, "timestamp": m.timestamp, "text": m.text}) + "\n")


def histories(messages: Iterable[Message]) -> dict[str, list[Message]]:
    """User -> their messages in timestamp order (stable: ties keep the given order)."""
    out: dict[str, list[Message]] = {}
    for m in messages:
        out.setdefault(m.user, []).append(m)
    return {u: sorted(ms, key=lambda m: m.timestamp) for u, ms in out.items()}


def user_sentences(messages: Iterable[Message]) -> dict[str, list[list[str]]]:
    """User -> the words of each sentence of their history, in order (DeepType's input text).
    Users whose messages hold no word keep an empty list."""
    return {u: [s for m in ms for s in sentences(m.text)] for u, ms in histories(messages).items()}
