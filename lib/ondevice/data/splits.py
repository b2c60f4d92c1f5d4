"""Per-user splits, the first-class concept of LEAF: which users train the global model (crowd),
which choose hyper-parameters (validation) and which measure results (test), and how one user's
history divides into personal training data and test data.

A split is made from the users' sizes and a `SplitRule` with its own seed (not the run's seed),
so every notebook of a data set at a scale shares it, whatever seeds it repeats over. It is saved
beside each result (`split.json`) and its digest is recorded in run.json.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from .. import streams


@dataclass(frozen=True)
class SplitRule:
    test_users: int
    test_min_words: int  # test users are drawn among users with at least this much text
    validation_users: int
    validation_min_words: int  # validation users: [min, max) words, disjoint from test users
    validation_max_words: int
    seed: int = 0
    # The crowd leaves out every user of a test or validation user's group (a play's other roles:
    # they speak in the same scenes, so the crowd's text would carry the test period's context).
    crowd_excludes_groups: bool = True


def group_of(user: str) -> str:
    """A user's group: the part of the name before the first "/" (Shakespeare: the play), else the user."""
    return user.partition("/")[0]


@dataclass(frozen=True)
class UserSplit:
    dataset: str
    rule: SplitRule
    crowd: tuple[str, ...]
    validation: tuple[str, ...]
    test: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "dataset": self.dataset,
            "rule": asdict(self.rule),
            "crowd": list(self.crowd),
            "validation": list(self.validation),
            "test": list(self.test),
        }

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()

    def role(self, user: str) -> str:
        """test, validation, crowd, or "set apart" (a user of a test or validation user's group)."""
        if user in self.test or user in self.validation:
            return "test" if user in self.test else "validation"
        return "crowd" if user in self.crowd else "set apart"


def _draw(candidates: list[str], n: int, rng, what: str) -> list[str]:
    if len(candidates) < n:
        raise ValueError(f"only {len(candidates)} users qualify as {what}; {n} requested")
    picked = rng.choice(len(candidates), size=n, replace=False)
    return [candidates[i] for i in sorted(picked)]


def make_split(dataset: str, sizes: dict[str, int], rule: SplitRule) -> UserSplit:
    """Test users drawn among the heavy users, validation users among lighter ones, the rest crowd."""
    users = sorted(sizes)
    test = _draw(
        [u for u in users if sizes[u] >= rule.test_min_words],
        rule.test_users,
        streams.rng(rule.seed, f"split/{dataset}/test"),
        f"test users (>= {rule.test_min_words} words)",
    )
    taken = set(test)
    validation = _draw(
        [u for u in users if u not in taken and rule.validation_min_words <= sizes[u] < rule.validation_max_words],
        rule.validation_users,
        streams.rng(rule.seed, f"split/{dataset}/validation"),
        f"validation users ({rule.validation_min_words}-{rule.validation_max_words - 1} words)",
    )
    taken |= set(validation)
    held_groups = {group_of(u) for u in taken} if rule.crowd_excludes_groups else set()
    crowd = tuple(u for u in users if u not in taken and group_of(u) not in held_groups)
    if not crowd:
        raise ValueError("no user is left for the crowd once the test and validation users' groups are set apart")
    return UserSplit(dataset, rule, crowd, tuple(validation), tuple(test))


def split_history(items: list, sizes: list[int], train_fraction: float) -> tuple[list, list]:
    """Earlier items (up to train_fraction of the words) for training, later ones for testing."""
    total, running = sum(sizes), 0
    for i, size in enumerate(sizes):
        if running + size > train_fraction * total and i > 0:
            return items[:i], items[i:]
        running += size
    return items[:-1], items[-1:]
