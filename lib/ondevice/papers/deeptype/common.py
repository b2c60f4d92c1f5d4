"""What every DeepType notebook shares: the users (Shakespeare's roles, or any per-user text file
given as `corpus`) and their split, the global text (the crowd, or a far corpus such as the Bible)
with its vocabulary and samples, the LSTM, and the global model trained on the global text to a
plateau of held-out global text (cached: trained once per machine, not once per notebook)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ondevice import params as _params
from ondevice import streams
from ondevice.data import bible, manifests, shakespeare, user_text
from ondevice.data.splits import SplitRule, UserSplit, group_of, make_split, split_history
from ondevice.data.typing_samples import CHARS, UNK_ID, Samples, Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm
from ondevice.params import ParameterError, Params
from ondevice.tasks.next_word import NextWordTask
from ondevice.training import model_cache
from ondevice.training.trainer import Plateau, Trainer, seed_everything

DATASET = "shakespeare"

# The LSTM and its global training per scale (the paper's values are the dataclass defaults).
MODEL_PRESETS = {
    "smoke": dict(vocab_size=800, embedding_dim=32, hidden_units=48, context_words=3),
    "default": dict(vocab_size=5000, embedding_dim=64, hidden_units=128, context_words=3),
    "paper": {},
}
# The global regime is TensorFlow's PTB LSTM, which the paper follows (Sec. 2): SGD at 1.0 on the
# loss summed over a sample's positions, gradients clipped at norm 5, the rate halved every epoch
# after the 4th, up to 13 epochs (PTB small; our default LSTM is smaller than its 200 units, so no
# dropout); it stops earlier when two epochs in a row lower the held-out global text's loss by less
# than 1%, keeping the best epoch. Paper scale (400 units, between PTB small and medium) takes the
# medium recipe: dropout 0.5, decay 0.8 after epoch 6, up to 39 epochs. Adam 0.002 on the
# per-position mean, the suite's earlier regime, is one of `sensitivity`'s switches.
GLOBAL_PRESETS = {
    "smoke": dict(crowd_max_words=12000, global_epochs=2, global_holdout_words=1500),
    "default": dict(crowd_max_words=0, global_epochs=13, global_min_improvement=0.01, global_holdout_words=20000),
    "paper": dict(global_epochs=39, global_seeds=3, dropout=0.5, global_lr_decay=0.8, global_decay_after=6),
}
SPLIT_PRESETS = {s: dataclasses.asdict(r) for s, r in shakespeare.SPLITS.items()}
# Every DeepType experiment's presets start from these (`ondevice.params.presets`).
PRESETS = _params.presets(MODEL_PRESETS, GLOBAL_PRESETS, SPLIT_PRESETS, {"smoke": dict(bootstrap=500)})
# What decides the global model's weights besides the seed, the split, the data and the code.
TRAINING_CODE = ("ondevice.training.trainer", "ondevice.tasks.next_word", "ondevice.models.lstm_lm", "ondevice.streams")
GLOBAL_FIELDS = tuple(
    "vocab_size embedding_dim hidden_units lstm_layers context_words crowd_max_words global_epochs global_batch_size "
    "global_learning_rate optimizer global_holdout_words global_patience global_min_improvement global_clip_norm "
    "global_lr_decay global_decay_after dropout global_loss_per".split()
)
GLOBAL_TEXTS = ("crowd", "bible")


def presets(extra: dict[str, dict]) -> dict[str, dict]:
    """The shared presets plus an experiment's own fields (same as `ondevice.params.presets(PRESETS, extra)`)."""
    return _params.presets(PRESETS, extra)


@dataclass(frozen=True)
class DeepTypeParams(Params):
    """Fields every DeepType notebook has; an experiment subclasses it with its own."""

    corpus: str = ""  # a per-user JSON Lines file (ondevice.data.user_text); "" = Shakespeare
    k: int = 3  # suggestions shown (top-k)
    vocab_size: int = 20000  # output words incl. <pad> and <unk>; paper: 20K
    embedding_dim: int = 400
    hidden_units: int = 400  # paper's softmax input is 400 wide (Sec. 5.1)
    lstm_layers: int = 2
    context_words: int = 10  # previous words of the sentence in each sample
    crowd_max_words: int = 0  # words of crowd text for the global model; 0 = all
    test_users: int = 20  # the user split (shared by every notebook on this data set)
    test_min_words: int = 3000
    validation_users: int = 10
    validation_min_words: int = 2000
    validation_max_words: int = 3000
    # The crowd leaves out the test and validation users' plays (their other roles share the test
    # period's scenes: 718 of 1,343 crowd roles did before); False is the old rule, users only.
    crowd_excludes_groups: bool = True
    personal_train_fraction: float = 0.7
    global_epochs: int = 13  # at most; training stops earlier at a plateau of the hold-out loss
    global_holdout_words: int = 50000  # global text held out (random sentences) for early stopping; 0 = none
    global_patience: int = 2  # epochs without improvement before stopping
    global_min_improvement: float = 0.01  # relative drop of the hold-out loss that counts as improvement
    global_seeds: int = 1  # global models, for the first min(global_seeds, seeds) seeds; seed i uses model i % that
    global_batch_size: int = 128
    # The global regime (GLOBAL_PRESETS): TensorFlow's PTB LSTM, which the paper says it follows.
    optimizer: str = "sgd"  # the global model's optimizer
    global_learning_rate: float = 1.0
    global_clip_norm: float = 5.0  # gradients' global norm at most this (0 = no clipping)
    global_lr_decay: float = 0.5  # the rate is multiplied by this every epoch after `global_decay_after`
    global_decay_after: int = 4
    dropout: float = 0.0  # on the embedding and the LSTM outputs while training
    global_loss_per: str = "sample"  # "sample": summed over a sample's positions (PTB); "position": their mean
    # Personal (on-device incremental) training, Sec. 4.1 and Table 1: the global configuration but
    # batch 16, mini-batch gradient descent, 5 epochs (`protocol` trains with these fields only).
    personal_optimizer: str = "sgd"  # sgd | adam; adam starts from a fresh (zero) state per user
    personal_learning_rate: float = 1.0  # the PTB LSTM configuration DeepType follows ([13]): SGD at 1.0
    personal_clip_norm: float = 5.0  # as the global regime (0 = no clipping)
    personal_loss_per: str = "sample"  # as the global regime
    personal_epochs: int = 5  # at most, with a hold-out; exactly, without one
    personal_batch_size: int = 16
    # Convergence per user: the chronologically last part of a user's *training* lines is held out
    # and personal training keeps the epoch (0 = the global model) with the lowest loss on it,
    # stopping after `personal_patience` epochs without a lower one. 0 = the fixed-epoch protocol.
    personal_holdout_fraction: float = 0.2
    personal_patience: int = 2
    seeds: int = 1  # repeats over seeds seed, seed+1, ... (training only; the split and crowd use `seed`)
    bootstrap: int = 2000  # resamples of users for the effects' intervals

    def check(self) -> None:
        self.at_least(1, *"k embedding_dim hidden_units lstm_layers test_users test_min_words seeds".split())
        self.at_least(1, "global_epochs", "global_batch_size", "global_seeds", "global_patience", "personal_batch_size")
        self.at_least(
            0, "validation_users", "context_words", "crowd_max_words", "global_holdout_words", "personal_epochs"
        )
        self.at_least(3, "vocab_size")  # <pad>, <unk> and a word
        self.at_least(100, "bootstrap")
        for name in ("global_learning_rate", "personal_learning_rate", "global_lr_decay"):
            self.require(getattr(self, name) > 0, name, "must be positive")
        self.at_least(0, "global_clip_norm", "personal_clip_norm", "global_decay_after")
        self.require(0 <= self.dropout < 1, "dropout", "must be in [0, 1)")
        for name in ("global_loss_per", "personal_loss_per"):
            self.require(getattr(self, name) in NextWordTask.LOSSES, name, f"must be one of {NextWordTask.LOSSES}")
        for name in ("optimizer", "personal_optimizer"):
            self.require(getattr(self, name) in ("adam", "sgd"), name, "must be 'adam' or 'sgd'")
        val, msg = self.validation_min_words < self.validation_max_words, "must be larger than validation_min_words"
        self.require(val, "validation_max_words", msg)
        self.require(self.k < self.vocab_size - 2, "k", "must be smaller than the number of words in the vocabulary")
        self.require(0 <= self.global_min_improvement < 1, "global_min_improvement", "must be in [0, 1)")
        msg = "must be a per-user JSON Lines file (user, timestamp, text) or empty for Shakespeare"
        self.require(not self.corpus or Path(self.corpus).is_file(), "corpus", msg)
        self.require(0 < self.personal_train_fraction < 1, "personal_train_fraction", "must be in (0, 1)")
        self.require(0 <= self.personal_holdout_fraction < 1, "personal_holdout_fraction", "must be in [0, 1)")
        self.at_least(1, "personal_patience")

    def at_least(self, minimum: float, *names: str) -> None:
        for name in names:
            self.require(getattr(self, name) >= minimum, name, f"must be at least {minimum}")

    def split_rule(self) -> SplitRule:
        names = ("test_users", "test_min_words", "validation_users", "validation_min_words", "validation_max_words")
        return SplitRule(*(getattr(self, n) for n in names), self.seed, self.crowd_excludes_groups)


@dataclass
class Corpus:
    """The data of a DeepType run: users, their split, the global model's text (`crowd`: the crowd
    users' sentences, or a far corpus's), its vocabulary and samples, and the held-out global text
    that decides when global training stops."""

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


def read_users(params: DeepTypeParams, speeches=None) -> tuple[manifests.Manifest, dict[str, list[list[str]]]]:
    """The users' data set and each user's sentences: the `corpus` file, or Shakespeare's roles."""
    if params.corpus:
        return user_file_manifest(Path(params.corpus)), user_text.user_sentences(user_text.read(params.corpus))
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


def load_corpus(params: DeepTypeParams, speeches=None, log=print, global_text="crowd", max_words=None) -> Corpus:
    """Read the users, split them, take the global text (the crowd's sentences, or the Bible's),
    hold part of it out, keep up to `max_words` of the rest (None: `crowd_max_words`; 0: all) and
    build the vocabulary from them. Depends on the data and `seed` only."""
    if global_text not in GLOBAL_TEXTS:
        raise ParameterError(f"global text must be one of {GLOBAL_TEXTS}, got {global_text!r}")
    manifest, users = read_users(params, speeches)
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
        source, global_manifest = user_text.user_sentences(bible.messages()), manifests.load("bible")
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


def model_config(params: DeepTypeParams, corpus: Corpus) -> lstm_lm.LSTMConfig:
    sizes = (corpus.vocab.input_size, corpus.vocab.size, params.embedding_dim, params.hidden_units)
    return lstm_lm.LSTMConfig(*sizes, params.lstm_layers, params.dropout)


def task(params: DeepTypeParams) -> NextWordTask:
    """The next-word task of personal (on-device) training, with its loss (`personal_loss_per`)."""
    return NextWordTask(params.k, loss_per=params.personal_loss_per)


def global_task(params: DeepTypeParams) -> NextWordTask:
    """The next-word task of global training, with its loss (`global_loss_per`)."""
    return NextWordTask(params.k, loss_per=params.global_loss_per)


def global_trainer(params: DeepTypeParams, model) -> tuple[Trainer, object]:
    """A trainer in the global regime and its per-epoch learning rate (constant, then decayed)."""
    rate, clip = params.global_learning_rate, params.global_clip_norm
    trainer = Trainer(model, global_task(params), rate, params.optimizer, clip_norm=clip)
    decay = params.global_lr_decay
    return trainer, lambda epoch: params.global_learning_rate * decay ** max(0, epoch - params.global_decay_after)


def global_rate(params: DeepTypeParams, epoch: int) -> float:
    """The global regime's learning rate in a (1-based) epoch: constant, then decayed (PTB); the
    schedule `global_trainer` returns (kept apart from it: its source is in the models' cache key)."""
    return params.global_learning_rate * params.global_lr_decay ** max(0, epoch - params.global_decay_after)


def build_model(params: DeepTypeParams, corpus: Corpus, seed: int):
    return lstm_lm.build(model_config(params, corpus), seed=streams.tf_seed(seed, "init/global"))


def model_card(model) -> dict:
    """Parameter count and float32 size, the numbers DeepType's Table 2 reports per model."""
    n = int(sum(np.prod(w.shape) for w in model.weights))
    layers = [{"layer": x.name, "type": type(x).__name__, "parameters": x.count_params()} for x in model.layers]
    return {"parameters": n, "size_mb": n * 4 / 1e6, "layers": layers}


def global_model(params: DeepTypeParams, corpus: Corpus, seed: int, log=print) -> model_cache.Entry:
    """The global model of one seed, trained on the global text (batch 128) until the hold-out loss
    improves by less than `global_min_improvement` (relative) for `global_patience` epochs, or for
    `global_epochs`; it keeps the last improving epoch's weights. From the cache if it exists."""

    def train():
        (trainer, schedule), held = global_trainer(params, build_model(params, corpus, seed)), corpus.holdout_samples
        scores = lambda m: {"holdout_loss": float(np.log(trainer.task.evaluate(m, held)["perplexity"]))}
        evaluate = scores if held else None
        stop = Plateau(params.global_patience, params.global_min_improvement) if held else None
        rng, label = streams.rng(seed, "batches/global"), f"global {corpus.global_text} (seed {seed})"
        args = (params.global_epochs, params.global_batch_size, rng, log, label, evaluate, stop)
        history, model = trainer.fit(corpus.crowd_samples, *args, schedule=schedule), trainer.model
        # reported: the epoch of the lowest hold-out loss (without a hold-out: the last epoch)
        best = int(np.argmin([h.get("holdout_loss", -h["epoch"]) for h in history])) + 1
        return model.get_weights(), {"history": list(history), "best_epoch": best, "plateau": history.plateau}

    fields = {name: getattr(params, name) for name in GLOBAL_FIELDS}
    fields.update(seed=seed, k=params.k, global_text=corpus.global_text)
    data = [a.sha256 for m in corpus.manifests for a in m.artifacts] + [corpus.crowd_samples.digest()]
    data += [corpus.holdout_samples.digest()] if corpus.holdout_samples is not None else []
    name = f"deeptype_global_{corpus.global_text}"
    return model_cache.cached_train(
        name, fields, data, TRAINING_CODE, train, log, sources=(global_model, global_trainer, global_task)
    )


@dataclass
class GlobalModels:
    """The trained global models (from the model cache or trained now), per run seed, and the
    Keras model whose weights are swapped in per seed. Seeds beyond `global_seeds` share a model."""

    model: object
    weights: dict[int, list[np.ndarray]]  # every run seed -> the weights of its global model
    entries: dict[int, model_cache.Entry]  # every run seed -> its global model's cache entry

    @property
    def from_cache(self) -> dict[int, bool]:
        return {s: e.hit for s, e in self.entries.items()}

    def unique(self) -> dict[int, model_cache.Entry]:
        """Each distinct global model once, under the first seed that uses it."""
        first: dict[str, int] = {}
        for s, e in self.entries.items():
            first.setdefault(e.key, s)
        return {s: self.entries[s] for s in first.values()}

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"phase": "global", "seed": s, "user": "", **h}
                for s, e in self.unique().items()
                for h in e.info["history"]
            ]
        )

    def cache(self) -> pd.DataFrame:
        """Each distinct global model: from the cache or not, epochs run, the epoch whose weights it
        keeps (the plateau rule's last improving one), the epoch of the lowest hold-out loss (later
        epochs may lower it by less than `global_min_improvement`), plateau reached, seeds, key."""
        columns = "seed from_cache epochs kept_epoch lowest_holdout_epoch plateau used_by_seeds train_seconds key"
        seeds = lambda e: [t for t, f in self.entries.items() if f.key == e.key]
        rows = [
            (s, e.hit, len(e.info["history"]), kept_epoch(e.info), e.info.get("best_epoch"), e.info.get("plateau"))
            + (seeds(e), e.info["train_seconds"], e.key[:16])
            for s, e in self.unique().items()
        ]
        return pd.DataFrame(rows, columns=columns.split())


def kept_epoch(info: dict) -> int | None:
    """The epoch whose weights a cached global model holds: its hold-out curve replayed through the
    plateau rule it was trained with (None without a hold-out)."""
    history, fields = info["history"], info.get("fields", {})
    if not history or "holdout_loss" not in history[0]:
        return None
    watch = Plateau(fields["global_patience"], fields["global_min_improvement"]).watch()
    no_weights = type("NoWeights", (), {"get_weights": lambda self: []})()
    for h in history:
        if watch.update(h["holdout_loss"], h["epoch"], no_weights):
            break
    return watch.epoch


def train_global(params: DeepTypeParams, corpus: Corpus, log=print) -> GlobalModels:
    """The global models (one per global seed), trained once per machine (model cache); run seed
    number i uses global model i % global_seeds."""
    seed_everything(params.seed)
    global_seeds = params.seed_list[: min(params.global_seeds, params.seeds)]
    trained = {s: global_model(params, corpus, s, log) for s in global_seeds}
    entries = {s: trained[global_seeds[i % len(global_seeds)]] for i, s in enumerate(params.seed_list)}
    return GlobalModels(build_model(params, corpus, params.seed), {s: e.weights for s, e in entries.items()}, entries)
