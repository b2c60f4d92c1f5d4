"""Per-user typed text for next-word prediction (DeepType's data, which AutLearn's availability
notebook reuses): the users (Shakespeare's roles, or any per-user text file given as `corpus`)
and their split, and the global text (the crowd, or a far corpus such as the Bible) with its
vocabulary and samples, part of it held out to decide when global training stops."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data import bible, manifests, sent140, shakespeare, user_text
from ondevice.data.splits import SplitRule, UserSplit, group_of, make_split, split_history
from ondevice.data.typing_samples import CHARS, UNK_ID, Samples, Vocabulary, build_samples, sentences
from ondevice.params import ParameterError

DATASET = "shakespeare"
# Public global texts (data set -> its per-user messages): the Bible (far) and Sent140's tweets (the
# paper's public Twitter corpus); "crowd" is the other users' own text.
PUBLIC_TEXTS = {"bible": bible.messages, "sent140": sent140.messages}
GLOBAL_TEXTS = ("crowd", *PUBLIC_TEXTS)


@dataclass
class Corpus:
    """The data of a typing run (DeepType's, AutLearn's availability): users, their split, the
    global model's text (`crowd`: the crowd users' sentences, or a far corpus's), its vocabulary
    and samples, and the held-out global text that decides when global training stops."""

    manifest: manifests.Manifest  # the users' data
    users: dict[str, list[list[str]]]
    split: UserSplit
    crowd: list[list[str]]
    vocab: Vocabulary
    crowd_samples: Samples
    context_words: int
    holdout_samples: Samples | None = None
    global_text: str = "crowd"  # one of GLOBAL_TEXTS
    global_manifest: manifests.Manifest | None = None  # the global text's data set (None: the users')

    def personal(self, user: str, train_fraction: float) -> tuple[Samples, Samples]:
        """A user's earlier lines (training) and later lines (test) as samples."""
        sents = self.users[user]
        train, test = split_history(sents, [len(s) for s in sents], train_fraction)
        return build_samples(train, self.vocab, self.context_words), build_samples(test, self.vocab, self.context_words)

    def personal_parts(self, user: str, params) -> tuple[Samples, Samples | None, Samples]:
        """A user's training lines less their last `personal_holdout_fraction` (None: no hold-out),
        that held-out part (which decides when personal training stops), and the test lines."""
        sents, build = self.users[user], lambda part: build_samples(part, self.vocab, self.context_words)
        train, test = split_history(sents, [len(s) for s in sents], params.personal_train_fraction)
        if not params.personal_holdout_fraction:
            return build(train), None, build(test)
        fit, held = split_history(train, [len(s) for s in train], 1 - params.personal_holdout_fraction)
        return build(fit), build(held), build(test)

    @property
    def manifests(self) -> list[manifests.Manifest]:
        return [self.manifest] + ([self.global_manifest] if self.global_manifest else [])

    def oov(self, words: list[str]) -> float:
        return float(np.mean([self.vocab.word_id(w) == UNK_ID for w in words])) if words else float("nan")

    def table(self) -> pd.DataFrame:
        """Users, words and out-of-vocabulary rate per role of the split, and of the global text."""
        text = lambda users: [w for u in users for s in self.users[u] for w in s]
        roles = {
            r: (len(getattr(self.split, r)), text(getattr(self.split, r))) for r in ("crowd", "validation", "test")
        }
        apart = [u for u in self.users if self.split.role(u) == "set apart"]
        roles["set apart (a test or validation user's play)"] = (len(apart), text(apart))
        users = len(self.split.crowd) if self.global_text == "crowd" else 0
        roles[f"{self.global_text} text of the global model"] = (users, [w for s in self.crowd for w in s])
        rows = [(role, n, len(words), self.oov(words)) for role, (n, words) in roles.items()]
        return pd.DataFrame(rows, columns=["role", "users", "words", "oov_rate"])

    def overlap(self, train_fraction: float, min_words: int = 5) -> pd.DataFrame:
        """What the global text still shares with the test users: its users in a test user's
        group, and the test lines (of at least `min_words` words) found word for word in it."""
        groups = {group_of(u) for u in self.split.test}
        shared = sum(group_of(u) in groups for u in self.split.crowd) if self.global_text == "crowd" else 0
        seen = {tuple(s) for s in self.crowd}
        later = [
            tuple(s)
            for u in self.split.test
            for s in split_history(self.users[u], [len(x) for x in self.users[u]], train_fraction)[1]
            if len(s) >= min_words
        ]
        found = sum(s in seen for s in later)
        return pd.DataFrame(
            [
                {
                    "global_text": self.global_text,
                    "global_users_in_a_test_users_group": shared,
                    f"test_lines_of_{min_words}_words_or_more": len(later),
                    "found_word_for_word_in_global_text": found,
                    "share_found": found / len(later) if later else float("nan"),
                }
            ]
        )

    def decode(self, sentence: str) -> pd.DataFrame:
        """DeepType's samples of one sentence, decoded (Sec. 2): one row per typed word, with the
        input steps (previous words, then the word's characters) and the label of each step."""
        samples = build_samples(sentences(sentence), self.vocab, self.context_words)
        name = lambda i: self.vocab.words[i] if i < self.vocab.size else f"'{CHARS[i - self.vocab.size]}'"
        steps = lambda a, j: " ".join(map(name, a[samples.offsets[j] : samples.offsets[j + 1]]))
        rows = [
            (self.vocab.words[t], steps(samples.inputs, j), steps(samples.labels, j))
            for j, t in enumerate(samples.target)
        ]
        return pd.DataFrame(rows, columns=["typed word", "inputs", "labels"])


def _global_text(sents: list[list[str]], holdout_words: int, max_words: int, rng: np.random.Generator):
    """Random sentences of the global text: the first `holdout_words` words held out for early
    stopping, then up to `max_words` (0 = all the rest) for training; both in corpus order."""
    held, train, n_held, n_train = [], [], 0, 0
    for i in rng.permutation(len(sents)):
        if n_held < holdout_words:
            held.append(i)
            n_held += len(sents[i])
        elif not max_words or n_train < max_words:
            train.append(i)
            n_train += len(sents[i])
    return [sents[i] for i in sorted(train)], [sents[i] for i in sorted(held)]


def user_file_manifest(path: Path) -> manifests.Manifest:
    """What run.json records about a researcher's own per-user text file (it is nobody's stand-in)."""
    path = Path(path)
    source = ({"kind": "local", "path": str(path)},)
    artifact = manifests.Artifact(path.name, manifests.sha256_of(path), path.stat().st_size, source)
    return manifests.Manifest(
        name=path.stem,
        path=path,
        description=f"per-user text from {path}",
        license="as given by the data's owner",
        citation=str(path),
        scales=("smoke", "default", "paper"),
        artifacts=(artifact,),
    )


def read_users(corpus: str = "", speeches=None) -> tuple[manifests.Manifest, dict[str, list[list[str]]]]:
    """The users' data set and each user's sentences: the per-user JSON Lines file `corpus`
    (`user_text`), or, when it is "", Shakespeare's roles (from `speeches` if given)."""
    if corpus:
        return user_file_manifest(Path(corpus)), user_text.user_sentences(user_text.read(corpus))
    return manifests.load(DATASET), shakespeare.users(speeches if speeches is not None else shakespeare.load_speeches())


MIN_USERS = {"test": 2, "validation": 1, "crowd": 1}  # a user file's split needs at least these
SCALED = {"test": 0.4, "validation": 0.2}  # shares of a user file's users when the preset asks too much


def scaled_rule(rule: SplitRule, sizes: dict[str, int]) -> SplitRule:
    """The split of a researcher's own user file: the preset's rule when enough users qualify for
    it; else shares of the users (40% test, 20% validation, at least 2 and 1, the rest crowd), the
    test users drawn from the heavier half and the validation users from the rest. Too few users
    (fewer than 4) stays an error that says how many are needed."""
    heavy = sorted(sizes.values(), reverse=True)
    enough_test = sum(v >= rule.test_min_words for v in heavy) >= rule.test_users
    enough_val = sum(rule.validation_min_words <= v < rule.validation_max_words for v in heavy) >= rule.validation_users
    if enough_test and enough_val and len(sizes) > rule.test_users + rule.validation_users:
        return rule
    n = len(sizes)
    if n < sum(MIN_USERS.values()):
        need = ", ".join(f"{k} {v}" for k, v in MIN_USERS.items())
        raise ParameterError(f"the corpus has {n} users; a split needs at least {sum(MIN_USERS.values())} ({need})")
    test = min(rule.test_users, max(MIN_USERS["test"], int(SCALED["test"] * n)))
    validation = min(rule.validation_users, max(MIN_USERS["validation"], int(SCALED["validation"] * n)))
    validation = min(validation, n - test - MIN_USERS["crowd"])
    threshold = heavy[max(test, (n - 1) // 2)]  # test users among the heavier half (ties included)
    return dataclasses.replace(
        rule,
        test_users=test,
        test_min_words=threshold,
        validation_users=validation,
        validation_min_words=1,
        validation_max_words=heavy[0] + 1,
    )


def load_corpus(params, speeches=None, log=print, global_text="crowd", max_words=None) -> Corpus:
    """Read the users, split them, take the global text (the crowd's sentences, or a public text's),
    hold part of it out, keep up to `max_words` of the rest (None: `crowd_max_words`; 0: all) and
    build the vocabulary from them. Depends on the data and `seed` only. `params` needs `corpus`,
    `seed`, `split_rule()`, `crowd_max_words`, `global_holdout_words`, `vocab_size` and
    `context_words` (`tasks.typing_protocol.DeepTypeParams` has them)."""
    if global_text not in GLOBAL_TEXTS:
        raise ParameterError(f"global text must be one of {GLOBAL_TEXTS}, got {global_text!r}")
    manifest, users = read_users(params.corpus, speeches)
    sizes = {u: sum(map(len, s)) for u, s in users.items()}
    rule = params.split_rule() if not params.corpus else scaled_rule(params.split_rule(), sizes)
    try:
        split = make_split(manifest.name, sizes, rule)
    except ValueError as exc:
        raise ParameterError(
            f"the user split parameters (test_users, test_min_words, validation_*) ask too much "
            f"for {manifest.name}: {exc}"
        ) from exc
    if global_text == "crowd":
        source, global_manifest = [s for u in split.crowd for s in users[u]], None
    else:
        source, global_manifest = user_text.user_sentences(PUBLIC_TEXTS[global_text]()), manifests.load(global_text)
        source = [s for sents in source.values() for s in sents]
    rng = streams.rng(params.seed, "crowd" if global_text == "crowd" else f"global/{global_text}")
    cap = params.crowd_max_words if max_words is None else max_words
    crowd, held = _global_text(source, params.global_holdout_words, cap, rng)
    vocab = Vocabulary.from_sentences(crowd, params.vocab_size)
    crowd_samples = build_samples(crowd, vocab, params.context_words)
    holdout = build_samples(held, vocab, params.context_words) if held else None
    log(
        f"users: {len(split.crowd)} crowd, {len(split.validation)} validation, {len(split.test)} test; "
        f"{global_text} text {sum(map(len, crowd))} words -> {len(crowd_samples)} samples "
        f"(+{sum(map(len, held))} held out); vocabulary {vocab.size}"
    )
    return Corpus(
        manifest, users, split, crowd, vocab, crowd_samples, params.context_words, holdout, global_text, global_manifest
    )
