"""What every AutLearn notebook shares (A1-A6): the public data and the personal users, the public
pre-trained models, and AutLearn's on-device step (train the last layer only on one user's data).

Interface (code against this; every function takes the params of a subclass of `AutLearnParams`):

    class Params(AutLearnParams):                  # a notebook's own fields on top of the shared ones
        PRESETS = presets({"smoke": {...}, "default": {...}, "paper": {...}})

    text = load_text(params, log)                  # TextData: Sent140 (public) -> vocabulary and
                                                   #   pre-training samples; Shakespeare users (personal),
                                                   #   text.users, text.train[u] / text.test[u] (Samples)
    images = load_images(params, log)              # ImageData: FEMNIST writers with LEAF's split,
                                                   #   images.users, images.train[u] / images.test[u] = (x, y)
    lstm = pretrained_text(params, text, log)      # Pretrained: LSTM pre-trained on Sent140 only (cached)
    cnn = pretrained_image(params, images, log)    # Pretrained: MobileNet v1, ImageNet weights, new head
    # .model (a Keras model), .weights (start weights: lstm.model.set_weights(lstm.weights)), .info

    hook = last_layer("text" | "image")            # FineTune hook: only "softmax" / "logits" trains
    params, table = choose_rates(params, text, images, {"text": lstm, "image": cnn})
                                                   # the on-device rates, chosen on validation users
                                                   #   (text.validation, images.validation)
    step = PersonalTrainer(params, "text" | "image", model)   # AutLearn's on-device step
    history = step.fit(start_weights, text.train[u], rng)     # -> step.model holds the user's model
    score_text(model, samples, k) -> {"top1", "top_k_eff", "perplexity"}
    score_image(model, (x, y))    -> {"top1", "loss"}
    image_features(model, x)      # pooled MobileNet features (the head's input) of images x

Privacy (the paper's autonomous rule, tested): the cloud side (`TextData.vocab`,
`TextData.public_train`/`public_holdout`, `pretrained_text`, `pretrained_image`) is computed from
public data only; the personal users' sentences enter `TextData.train`/`test` alone, and the
pre-trained model's cache key holds the public samples' digest, never the users'.

Data at each scale (the paper: the 10% of users with the most data, for both data sets):
- text: the public corpus is LEAF Sent140 (the mirror holds its small-sized test split only,
  8,692 tweets: thin); personal users are the suite's Shakespeare roles (LEAF's users), the top
  `text_top_fraction` by words (10%: 137 of 1,369 roles), of which `text_users` are drawn at
  random when it is not 0 (default: a sample, for the CPU budget). Each user's sentences are split
  by order: the earlier `personal_train_fraction` of the words train, the later ones test.
- images: LEAF FEMNIST writers with LEAF's own 90/10 split per writer. `image_top_fraction`: the
  paper's 10% rule applies at paper scale (LEAF's full FEMNIST through `femnist_dir`); at smoke and
  default the mirror holds 105 writers (a 5% sample of FEMNIST), whose top 10% would be 11 writers
  with 187 test images, too few to tell a 1% difference, so those scales keep all writers read.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras

from ondevice import streams
from ondevice.data import femnist, manifests, sent140
from ondevice.data.splits import split_history
from ondevice.data.typing_samples import UNK_ID, Samples, Vocabulary, build_samples, sentences
from ondevice.models import lstm_lm, mobilenet_v1
from ondevice.papers.deeptype import common as deeptype_common
from ondevice.papers.deeptype.techniques.bucketing import EqualLength
from ondevice.papers.deeptype.techniques.fine_tune import FineTune
from ondevice.params import Params
from ondevice.report import provenance
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask, position_scores
from ondevice.training import model_cache, selection
from ondevice.training.trainer import Trainer

KINDS = ("text", "image")
MODEL_NAMES = {"text": "LSTM", "image": "MobileNet"}
LAST_LAYER = {"text": "softmax", "image": mobilenet_v1.HEAD}
# MobileNet widths with a declared ImageNet weight file (paper: 1.0, declared without a checksum).
MOBILENET_WEIGHTS = {0.25: "mobilenet_v1_imagenet", 1.0: "mobilenet_v1_imagenet_1_0"}

# Shared fields per scale; the paper leaves every one of them open except the vocabulary (10K),
# the two LSTM layers, bucketing, "last layer only" and the top-10% rule.
# - LSTM: 10K words (paper), embedding 64 / 96 units at default (near DeepType's default-scale
#   sizes, narrower for the CPU budget; the paper gives none; paper scale: 400 / 400, DeepType's),
#   3 previous words of context per sample at smoke/default (10 at paper), DeepType's samples.
# - Pre-training on Sent140: Adam 0.002, batch 64, equal-length buckets, until the loss on 10% of
#   the tweets (held out) falls by less than 1% in an epoch (a plateau), at most `pretrain_epochs`
#   (default 12, about 2 CPU minutes per epoch at 10K words; a one-time cost, cached).
# - On-device step (AutLearn, CloudCustomize): LSTM softmax by SGD (DeepType's personal optimizer),
#   batch 16 (the paper's LSTM batch), 3 epochs (default 2, CPU budget); MobileNet head by Adam,
#   batch 16, 15 epochs (a fresh head over 62 classes needs many small steps; the paper's phones
#   used batch 1 for memory, which changes time, not what is learnt). The rates are chosen on the
#   validation users from `text_rate_candidates` / `image_rate_candidates` by the notebooks that
#   train users (`choose_rate`). The default preset holds the rates that choice gave at default
#   (SGD 0.1 of 0.01-3, Adam 0.03 of 0.0003-0.1; results/default/autlearn_accuracy/tables/
#   rate_selection.csv): the timing notebook uses them, and every notebook falls back to them
#   when the candidates are empty.
# - Validation users (`validation_users`, 6 per kind at default) are drawn first from the same
#   top-10% pool and are never test users: AutLearn's on-device learning rate is chosen on them
#   (`choose_rate`, the highest mean top-1 on their later parts), never on test users.
# - Users at default: 12 of the other 131 top-10% Shakespeare roles (CPU budget), the other 99 of
#   the mirror's 105 FEMNIST writers.
# - MobileNet: alpha 0.25 (the ImageNet weights in the mirror; paper scale 1.0), 28x28 -> 64x64.
SHARED_PRESETS = {
    "smoke": dict(
        vocab_size=800,
        embedding_dim=16,
        hidden_units=32,
        context_words=3,
        text_users=4,
        user_max_words=1000,
        pretrain_epochs=1,
        pretrain_max_tweets=1500,
        femnist_pairs=2,
        image_top_fraction=1.0,
        image_users=0,
        image_size=32,
        text_personal_epochs=1,
        image_personal_epochs=5,
        validation_users=2,
        text_rate_candidates=(0.1, 1.0),
        image_rate_candidates=(0.003, 0.03),
    ),
    "default": dict(
        vocab_size=10000,
        embedding_dim=64,
        hidden_units=96,
        context_words=3,
        text_users=12,
        pretrain_epochs=12,
        femnist_pairs=0,
        image_top_fraction=1.0,
        image_users=0,
        image_size=64,
        text_personal_epochs=2,
        text_personal_learning_rate=0.1,
        image_personal_learning_rate=0.03,
    ),
    "paper": dict(
        vocab_size=10000,
        embedding_dim=400,
        hidden_units=400,
        context_words=10,
        text_users=0,
        pretrain_epochs=20,
        image_top_fraction=0.1,
        image_users=0,
        mobilenet_alpha=1.0,
        image_size=224,
    ),
}


def presets(extra: dict[str, dict]) -> dict[str, dict]:
    """A notebook's presets: the shared fields per scale plus its own (its own win)."""
    return {scale: {**SHARED_PRESETS[scale], **extra.get(scale, {})} for scale in SHARED_PRESETS}


@dataclass(frozen=True)
class AutLearnParams(Params):
    """Fields every AutLearn notebook has; a notebook subclasses it with its own."""

    # data
    corpus: str = ""  # per-user JSON Lines file for the personal text; "" = Shakespeare
    sent140_dir: str = ""  # LEAF Sent140 JSON output to read instead of the mirror (paper scale)
    pretrain_max_tweets: int = 0  # public tweets used (random sample); 0 = all
    text_top_fraction: float = 0.1  # the paper's rule: the 10% of users with the most data
    text_users: int = 0  # a random sample of those (0 = all of them)
    user_max_words: int = 0  # each chosen user's first words only (0 = all; smoke: fast)
    femnist_dir: str = ""  # LEAF FEMNIST JSON output to read instead of the mirror (paper scale)
    femnist_pairs: int = 0  # LEAF train/test file pairs read (0 = all)
    image_top_fraction: float = 0.1
    image_users: int = 0  # a random sample of the top writers (0 = all of them)
    validation_users: int = 6  # per kind, drawn first from the top fraction; choose the rates, never tested
    personal_train_fraction: float = 0.8  # earlier words of a user train, later ones test (LEAF's -tf 0.8)
    # the LSTM and its pre-training on public text
    vocab_size: int = 10000  # incl. <pad> and <unk>; the paper's 10K most frequent words
    embedding_dim: int = 400
    hidden_units: int = 400
    lstm_layers: int = 2
    context_words: int = 10
    k: int = 3  # DeepType's top-k-eff beside top-1
    pretrain_epochs: int = 6  # at most; stops at a plateau of the held-out public loss
    pretrain_batch_size: int = 64
    pretrain_learning_rate: float = 0.002
    pretrain_holdout_fraction: float = 0.1  # public tweets held out for the plateau
    pretrain_min_improvement: float = 0.01
    # MobileNet
    mobilenet_alpha: float = 0.25
    image_size: int = 64
    # the on-device step (last layer only)
    text_personal_optimizer: str = "sgd"
    text_personal_learning_rate: float = 1.0
    text_personal_epochs: int = 3
    text_personal_batch_size: int = 16
    image_personal_optimizer: str = "adam"
    image_personal_learning_rate: float = 0.003
    image_personal_epochs: int = 15
    image_personal_batch_size: int = 16
    # candidates for the on-device rate, chosen on the validation users (the more conservative
    # first: ties go to it); empty = keep the preset's rate
    text_rate_candidates: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    image_rate_candidates: tuple[float, ...] = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)

    def check(self) -> None:
        for name in (
            "embedding_dim",
            "hidden_units",
            "lstm_layers",
            "k",
            "pretrain_epochs",
            "pretrain_batch_size",
            "text_personal_batch_size",
            "image_personal_batch_size",
        ):
            self.require(getattr(self, name) >= 1, name, "must be at least 1")
        for name in (
            "text_users",
            "user_max_words",
            "validation_users",
            "image_users",
            "femnist_pairs",
            "pretrain_max_tweets",
            "context_words",
            "text_personal_epochs",
            "image_personal_epochs",
        ):
            self.require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in ("text_top_fraction", "image_top_fraction"):
            self.require(0 < getattr(self, name) <= 1, name, "must be in (0, 1]")
        for name in ("personal_train_fraction", "pretrain_holdout_fraction"):
            self.require(0 < getattr(self, name) < 1, name, "must be in (0, 1)")
        self.require(0 <= self.pretrain_min_improvement < 1, "pretrain_min_improvement", "must be in [0, 1)")
        self.require(self.vocab_size >= 3, "vocab_size", "must be at least 3 (<pad>, <unk> and a word)")
        self.require(self.k < self.vocab_size - 2, "k", "must be smaller than the number of words in the vocabulary")
        self.require(
            self.mobilenet_alpha in MOBILENET_WEIGHTS,
            "mobilenet_alpha",
            f"must be a width with declared ImageNet weights, one of {sorted(MOBILENET_WEIGHTS)}",
        )
        self.require(self.image_size >= 32, "image_size", "must be at least 32 (MobileNet's smallest input)")
        for name in ("pretrain_learning_rate", "text_personal_learning_rate", "image_personal_learning_rate"):
            self.require(getattr(self, name) > 0, name, "must be positive")
        for name in ("text_rate_candidates", "image_rate_candidates"):
            self.require(all(c > 0 for c in getattr(self, name)), name, "must hold positive learning rates")
        for name in ("text_personal_optimizer", "image_personal_optimizer"):
            self.require(getattr(self, name) in ("sgd", "adam"), name, "must be 'sgd' or 'adam'")
        for name in ("corpus", "sent140_dir", "femnist_dir"):
            value = getattr(self, name)
            self.require(
                not value or Path(value).exists(), name, "must name an existing file or directory, or be empty"
            )


def top_users(
    sizes: dict[str, int], fraction: float, n: int, n_validation: int, seed: int, purpose: str
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(test users, validation users): of the ceil(fraction * users) users with the most data (ties
    by name), `n_validation` drawn at random from their own stream, then `n` of the rest (0 = all
    of the rest); each in sorted order. The two never overlap."""
    ranked = sorted(sizes, key=lambda u: (-sizes[u], u))[: math.ceil(fraction * len(sizes))]
    if n_validation >= len(ranked):
        raise ValueError(
            f"{n_validation} validation users leave no test user among the top {len(ranked)}; "
            "lower validation_users or raise the top fraction"
        )
    order = streams.rng(seed, purpose).permutation(len(ranked))
    rest = order[n_validation:]
    if n and n < len(rest):
        rest = rest[:n]
    return tuple(sorted(ranked[i] for i in rest)), tuple(sorted(ranked[i] for i in order[:n_validation]))


@dataclass
class Validation:
    """The validation users of one kind, each with its earlier (training) and later (test) part:
    they choose hyper-parameters and are never scored as test users nor pooled in the cloud."""

    users: tuple[str, ...]
    train: dict
    test: dict


# ---- text -------------------------------------------------------------------------------------


@dataclass
class TextData:
    """Public text (vocabulary, pre-training samples) and the personal users' samples.

    `vocab`, `public_train` and `public_holdout` come from Sent140 alone: the cloud side. `train`
    and `test` hold each personal user's earlier and later sentences as samples: the devices."""

    manifest: manifests.Manifest  # the personal users' data set
    public_manifest: manifests.Manifest  # Sent140
    public_files: list[Path]
    vocab: Vocabulary
    public_train: Samples
    public_holdout: Samples
    users: tuple[str, ...]
    train_sentences: dict[str, list[list[str]]]
    test_sentences: dict[str, list[list[str]]]
    context_words: int
    all_users: int  # users in the data set before the top-fraction rule
    validation_users: tuple[str, ...] = ()  # their sentences are in train_sentences / test_sentences too
    train: dict[str, Samples] = field(default_factory=dict)
    test: dict[str, Samples] = field(default_factory=dict)
    validation: Validation | None = None

    def __post_init__(self):
        samples = lambda part, u: build_samples(part[u], self.vocab, self.context_words)
        for u in self.users:
            self.train[u], self.test[u] = samples(self.train_sentences, u), samples(self.test_sentences, u)
        self.validation = Validation(
            self.validation_users,
            {u: samples(self.train_sentences, u) for u in self.validation_users},
            {u: samples(self.test_sentences, u) for u in self.validation_users},
        )

    def pooled_train(self) -> Samples:
        """Every user's training sentences as one sample set (what CloudTrain collects)."""
        return build_samples([s for u in self.users for s in self.train_sentences[u]], self.vocab, self.context_words)

    @property
    def manifests(self) -> list[manifests.Manifest]:
        return [self.public_manifest, self.manifest]

    def table(self) -> pd.DataFrame:
        """Words, samples and out-of-vocabulary rate of the public text and of the users' parts."""

        def row(role, users, samples: list[Samples], words):
            n = sum(len(s) for s in samples)
            oov = sum(int((s.target == UNK_ID).sum()) for s in samples) / n if n else float("nan")
            return {"data": role, "users": users, "words": words, "samples": n, "oov_rate": oov}

        pub = len(self.public_train) + len(self.public_holdout)
        return pd.DataFrame(
            [
                row("Sent140 (public): pre-training", "", [self.public_train], len(self.public_train)),
                row("Sent140 (public): held out for the plateau", "", [self.public_holdout], len(self.public_holdout)),
                row(
                    "personal users: training part",
                    len(self.users),
                    list(self.train.values()),
                    sum(len(w) for u in self.users for w in self.train_sentences[u]),
                ),
                row(
                    "personal users: test part",
                    len(self.users),
                    list(self.test.values()),
                    sum(len(w) for u in self.users for w in self.test_sentences[u]),
                ),
            ]
        ).assign(public_words=pub)


def public_sentences(params: AutLearnParams, tweets: dict[str, list[str]] | None = None):
    """Sent140's sentences split into (training, held-out) by tweet at random, and the files read.
    `tweets` (user -> texts) replaces the data set (tests)."""
    files: list[Path] = []
    if tweets is None:
        tweets, files = sent140.load(params.sent140_dir)
    texts = [t for user in sorted(tweets) for t in tweets[user]]
    rng = streams.rng(params.seed, "autlearn/sent140")
    order = rng.permutation(len(texts))
    if params.pretrain_max_tweets:
        order = order[: params.pretrain_max_tweets]
    n_held = max(1, round(params.pretrain_holdout_fraction * len(order)))
    pick = lambda idx: [s for i in sorted(idx) for s in sentences(sent140.clean(texts[i]))]
    return pick(order[n_held:]), pick(order[:n_held]), files


def _first_words(sents: list[list[str]], limit: int) -> list[list[str]]:
    """The first sentences holding up to `limit` words (at least one sentence; all when limit is 0)."""
    if not limit:
        return sents
    n = np.searchsorted(np.cumsum([len(s) for s in sents]), limit, side="right")
    return sents[: max(1, int(n))]


def load_text(params: AutLearnParams, log=print, speeches=None, tweets=None) -> TextData:
    """The public corpus (vocabulary: its `vocab_size` most frequent words; samples for
    pre-training) and the personal users (top fraction by words, each split by order).
    `speeches` / `tweets` replace the Shakespeare speeches / Sent140 tweets (tests)."""
    public, held_out, files = public_sentences(params, tweets)
    vocab = Vocabulary.from_sentences(public + held_out, params.vocab_size)
    manifest, users = deeptype_common.read_users(params, speeches)
    sizes = {u: sum(map(len, s)) for u, s in users.items()}
    chosen, held = top_users(
        sizes, params.text_top_fraction, params.text_users, params.validation_users, params.seed, "autlearn/text-users"
    )
    train, test = {}, {}
    for u in chosen + held:
        sents = _first_words(users[u], params.user_max_words)
        train[u], test[u] = split_history(sents, [len(s) for s in sents], params.personal_train_fraction)
    data = TextData(
        manifest,
        manifests.load("sent140"),
        files,
        vocab,
        build_samples(public, vocab, params.context_words),
        build_samples(held_out, vocab, params.context_words),
        chosen,
        train,
        test,
        params.context_words,
        len(users),
        held,
    )
    log(
        f"public Sent140: {sum(map(len, public))} + {sum(map(len, held_out))} held-out words, vocabulary {vocab.size}; "
        f"personal: {len(chosen)} of {len(users)} users (top {params.text_top_fraction:.0%} by words"
        f"{f', {params.text_users} drawn' if params.text_users else ''}; {len(held)} more for validation), "
        f"{sum(len(s) for s in data.train.values())} training / {sum(len(s) for s in data.test.values())} test words"
    )
    return data


def text_model(params: AutLearnParams, data: TextData, seed: int) -> keras.Model:
    config = lstm_lm.LSTMConfig(
        data.vocab.input_size, data.vocab.size, params.embedding_dim, params.hidden_units, params.lstm_layers
    )
    return lstm_lm.build(config, seed=streams.tf_seed(seed, "init/autlearn-lstm"))


@dataclass
class Pretrained:
    """A public pre-trained model: the Keras model, its start weights, and how it was made."""

    model: keras.Model
    weights: list[np.ndarray]
    info: dict
    from_cache: bool

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self.info.get("history", []))


PRETRAIN_FIELDS = (
    "vocab_size",
    "embedding_dim",
    "hidden_units",
    "lstm_layers",
    "context_words",
    "pretrain_epochs",
    "pretrain_batch_size",
    "pretrain_learning_rate",
    "pretrain_holdout_fraction",
    "pretrain_min_improvement",
    "pretrain_max_tweets",
    "sent140_dir",
    "k",
)
PRETRAIN_CODE = (
    "ondevice.training.trainer",
    "ondevice.tasks.next_word",
    "ondevice.models.lstm_lm",
    "ondevice.streams",
    "ondevice.papers.deeptype.techniques.bucketing",
)


def pretrained_text(params: AutLearnParams, data: TextData, log=print, seed: int | None = None) -> Pretrained:
    """The LSTM pre-trained in the cloud on public Sent140 text only (Adam, equal-length buckets),
    keeping the epoch with the lowest held-out public loss; stops when an epoch lowers it by less
    than `pretrain_min_improvement`. From the model cache when it exists (keyed by the fields, the
    PUBLIC samples' digests and the training code: no personal data can enter the key or the model)."""
    seed = params.seed if seed is None else seed
    model = text_model(params, data, seed)
    task = NextWordTask(params.k)

    def train():
        trainer = Trainer(model, task, params.pretrain_learning_rate, "adam", hooks=[EqualLength()])
        rng = streams.rng(seed, "batches/autlearn-pretrain")
        history, best, best_loss = [], None, np.inf
        for epoch in range(1, params.pretrain_epochs + 1):
            row = trainer.fit(
                data.public_train, 1, params.pretrain_batch_size, rng, log, f"pre-training on Sent140 (seed {seed})"
            )[0]
            row.update(epoch=epoch, holdout_loss=float(np.log(task.evaluate(model, data.public_holdout)["perplexity"])))
            log(f"pre-training epoch {epoch}: held-out public loss {row['holdout_loss']:.3f}")
            history.append(row)
            improved = row["holdout_loss"] < best_loss * (1 - params.pretrain_min_improvement)
            if row["holdout_loss"] < best_loss:
                best, best_loss = model.get_weights(), row["holdout_loss"]
            if not improved:
                break
        return best, {"history": history, "best_epoch": int(np.argmin([h["holdout_loss"] for h in history])) + 1}

    fields = {name: getattr(params, name) for name in PRETRAIN_FIELDS} | {"seed": seed}
    digests = [a.sha256 for a in data.public_manifest.artifacts] + [
        data.public_train.digest(),
        data.public_holdout.digest(),
    ]
    code = model_cache.code_digest(
        [f for m in PRETRAIN_CODE for f in provenance.module_files(m)], extra=inspect.getsource(pretrained_text)
    )
    entry = model_cache.load_or_train("autlearn_lstm_sent140", fields, digests, code, train, log)
    model.set_weights(entry.weights)
    return Pretrained(model, entry.weights, entry.info, entry.hit)


def score_text(model, samples: Samples, k: int, batch_size: int = 256) -> dict:
    """top1: the next word, predicted before any of its characters is typed, is the first
    suggestion (samples with a previous word; <unk> never counts as right, as a keyboard cannot
    show it), plus DeepType's top-k-eff and the perplexity over all positions."""
    scores = NextWordTask(k, batch_size).evaluate(model, samples)
    hits, n = 0, 0
    with_context = np.flatnonzero(samples.n_context > 0)
    for start in range(0, len(with_context), batch_size):
        idx = with_context[start : start + batch_size]
        x, y = samples.padded(idx)
        hit, _ = position_scores(model(x, training=False), tf.constant(y), tf.constant(1))
        hits += int(hit.numpy()[np.arange(len(idx)), samples.n_context[idx] - 1].sum())
        n += len(idx)
    return {
        "top1": hits / n if n else float("nan"),
        "top_k_eff": scores["top_k_eff"],
        "perplexity": scores["perplexity"],
    }


# ---- images -----------------------------------------------------------------------------------


@dataclass
class ImageData:
    """FEMNIST writers chosen by the top-fraction rule, with LEAF's train/test split per writer."""

    manifest: manifests.Manifest
    files: list[Path]
    users: tuple[str, ...]
    train: dict[str, tuple[np.ndarray, np.ndarray]]
    test: dict[str, tuple[np.ndarray, np.ndarray]]
    all_users: int
    validation: Validation = field(default_factory=lambda: Validation((), {}, {}))

    def pooled_train(self) -> tuple[np.ndarray, np.ndarray]:
        """Every writer's training images as one set (what CloudTrain collects)."""
        return (
            np.concatenate([self.train[u][0] for u in self.users]),
            np.concatenate([self.train[u][1] for u in self.users]),
        )

    def table(self) -> pd.DataFrame:
        rows = []
        for part, d in (("training (LEAF's 90%)", self.train), ("test (LEAF's 10%)", self.test)):
            n = [len(d[u][1]) for u in self.users]
            rows.append(
                {
                    "data": f"FEMNIST writers: {part}",
                    "users": len(self.users),
                    "images": int(sum(n)),
                    "per_user_min": int(min(n)),
                    "per_user_median": float(np.median(n)),
                    "per_user_max": int(max(n)),
                    "classes_seen": int(len(np.unique(np.concatenate([d[u][1] for u in self.users])))),
                }
            )
        return pd.DataFrame(rows).assign(writers_read=self.all_users)


def load_images(params: AutLearnParams, log=print) -> ImageData:
    """FEMNIST writers (`femnist_pairs` LEAF file pairs), the top `image_top_fraction` by images
    (then `image_users` drawn at random when not 0), with LEAF's own split."""
    train, test, files = femnist.load(params.femnist_dir, params.femnist_pairs)
    sizes = {u: len(train[u][1]) + len(test[u][1]) for u in train}
    chosen, held = top_users(
        sizes,
        params.image_top_fraction,
        params.image_users,
        params.validation_users,
        params.seed,
        "autlearn/image-users",
    )
    data = ImageData(
        manifests.load("femnist"),
        files,
        chosen,
        {u: train[u] for u in chosen},
        {u: test[u] for u in chosen},
        len(train),
        Validation(held, {u: train[u] for u in held}, {u: test[u] for u in held}),
    )
    log(
        f"FEMNIST: {len(chosen)} of {len(train)} writers (and {len(held)} for validation), "
        f"{sum(len(data.train[u][1]) for u in chosen)} training / "
        f"{sum(len(data.test[u][1]) for u in chosen)} test images"
    )
    return data


def mobilenet_weights(params: AutLearnParams) -> tuple[manifests.Manifest, Path]:
    """The ImageNet weight file of MobileNet at `mobilenet_alpha`, fetched and verified."""
    m = manifests.load(MOBILENET_WEIGHTS[params.mobilenet_alpha])
    return m, manifests.fetch_artifact(m, m.artifacts[0], verbose=False)


def pretrained_image(
    params: AutLearnParams, data: ImageData | None = None, log=print, seed: int | None = None
) -> Pretrained:
    """MobileNet v1 with the ImageNet weights (the public pre-trained model: nothing is trained on
    users, nothing is trained here at all) and a new `logits` head over FEMNIST's 62 classes, its
    initial weights drawn from the seed's own stream."""
    seed = params.seed if seed is None else seed
    manifest, path = mobilenet_weights(params)
    model = mobilenet_v1.build(
        path,
        params.mobilenet_alpha,
        params.image_size,
        femnist.CLASSES,
        seed=streams.tf_seed(seed, "init/autlearn-head"),
    )
    log(
        f"MobileNet v1 (alpha {params.mobilenet_alpha}) with ImageNet weights from {path.name}; "
        f"input 28x28 grey -> {params.image_size}x{params.image_size} RGB; new {femnist.CLASSES}-class head"
    )
    return Pretrained(model, model.get_weights(), {"weights": manifest.summary()}, from_cache=False)


def image_features(model: keras.Model, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The pooled MobileNet features of images x under the model's current weights."""
    features = mobilenet_v1.feature_model(model)
    return np.concatenate(
        [features(x[i : i + batch_size], training=False).numpy() for i in range(0, len(x), batch_size)]
    )


def score_image(model: keras.Model, data: tuple[np.ndarray, np.ndarray]) -> dict:
    """top1 accuracy (and loss) of a writer's images."""
    r = ClassificationTask((femnist.SIDE, femnist.SIDE, 1), femnist.CLASSES).evaluate(model, data)
    return {"top1": r["accuracy"], "loss": r["loss"]}


def image_task() -> ClassificationTask:
    return ClassificationTask((femnist.SIDE, femnist.SIDE, 1), femnist.CLASSES)


# ---- the on-device step -------------------------------------------------------------------------


def last_layer(kind: str) -> FineTune:
    """AutLearn's transfer learning: only the last layer trains (LSTM: the softmax; MobileNet: the
    FC head, whose softmax is in the loss); DeepType's FineTune hook does exactly this."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return FineTune(LAST_LAYER[kind])


class PersonalTrainer:
    """One user's on-device step: from given start weights, train the last layer only on the
    user's training data with a fresh optimizer; afterwards `model` holds the user's model.

    Text: a Trainer of the whole LSTM with the `last_layer` hook and equal-length buckets (batches
    need no padding: the paper's bucketing). Images: the backbone is frozen and in inference mode,
    so its features of a user's images are computed once and the head trains on them (the same
    variables and gradients as the hook on the whole model, a forward pass cheaper per step)."""

    def __init__(self, params: AutLearnParams, kind: str, model: keras.Model):
        self.params, self.kind, self.model = params, kind, model
        if kind == "text":
            self.trainer = Trainer(
                model,
                NextWordTask(params.k),
                params.text_personal_learning_rate,
                params.text_personal_optimizer,
                hooks=[last_layer(kind), EqualLength()],
            )
            self.epochs, self.batch_size = params.text_personal_epochs, params.text_personal_batch_size
        elif kind == "image":
            head = mobilenet_v1.head_model(model)
            self.trainer = Trainer(
                head,
                ClassificationTask(head.input_shape[1:], femnist.CLASSES),
                params.image_personal_learning_rate,
                params.image_personal_optimizer,
            )
            self.epochs, self.batch_size = params.image_personal_epochs, params.image_personal_batch_size
        else:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")

    def fit(self, start: list[np.ndarray], train, rng: np.random.Generator, epochs: int | None = None) -> list[dict]:
        """Train from `start` on `train` (Samples, or (images, labels)); the per-epoch history."""
        self.model.set_weights(start)
        self.trainer.reset(self.trainer.model.get_weights())  # zero optimizer state, same weights
        if self.kind == "image":
            train = (image_features(self.model, train[0]), train[1])
        return self.trainer.fit(train, self.epochs if epochs is None else epochs, self.batch_size, rng)


def choose_rate(
    params: AutLearnParams, kind: str, data: TextData | ImageData, pre: Pretrained, log=print
) -> tuple[AutLearnParams, pd.DataFrame]:
    """AutLearn's on-device learning rate for one kind, chosen on the validation users: each
    candidate runs the on-device step from the public model on every validation user's earlier
    part and is scored by the mean top-1 on their later parts (ties: the earlier candidate). The
    params with the chosen rate, and the table of every candidate's score (with the public model's
    own score as a reference row, rate 0). No candidates or no validation users: the preset's rate."""
    name = f"{kind}_personal_learning_rate"
    candidates, val = getattr(params, f"{kind}_rate_candidates"), data.validation
    if not candidates or not val.users:
        log(f"{MODEL_NAMES[kind]}: on-device rate {getattr(params, name)} from the preset (nothing to choose on)")
        return params, pd.DataFrame()
    score = (
        (lambda m, u: score_text(m, val.test[u], params.k)["top1"])
        if kind == "text"
        else (lambda m, u: score_image(m, val.test[u])["top1"])
    )

    def mean_top1(candidate: dict) -> float:
        step = PersonalTrainer(dataclasses.replace(params, **{name: candidate["learning_rate"]}), kind, pre.model)
        tops = []
        for u in val.users:
            step.fit(pre.weights, val.train[u], streams.rng(params.seed, f"validation/{kind}/{u}"))
            tops.append(score(pre.model, u))
        return float(np.mean(tops))

    best, table = selection.select([{"learning_rate": c} for c in candidates], mean_top1, log)
    pre.model.set_weights(pre.weights)
    reference = float(np.mean([score(pre.model, u) for u in val.users]))
    # rate 0: no step, the public model itself (for reference; not a candidate)
    table = pd.concat(
        [table, pd.DataFrame([{"learning_rate": 0.0, "score": reference, "chosen": False}])], ignore_index=True
    )
    table = table.rename(columns={"score": "validation mean top-1"}).assign(
        model=MODEL_NAMES[kind],
        optimizer=getattr(params, f"{kind}_personal_optimizer"),
        validation_users=len(val.users),
    )
    log(
        f"{MODEL_NAMES[kind]}: on-device rate {best['learning_rate']} chosen on {len(val.users)} validation users "
        f"(mean top-1 {table.loc[table.chosen, 'validation mean top-1'].iloc[0]:.4f}; public model {reference:.4f})"
    )
    return dataclasses.replace(params, **{name: best["learning_rate"]}), table


def choose_rates(
    params: AutLearnParams, text: TextData, images: ImageData, pre: dict[str, Pretrained], log=print
) -> tuple[AutLearnParams, pd.DataFrame]:
    """Both models' on-device rates (`choose_rate` per kind): the params to train users with, and
    one selection table."""
    tables = []
    for kind, data in (("text", text), ("image", images)):
        params, table = choose_rate(params, kind, data, pre[kind], log)
        tables.append(table)
    return params, pd.concat(tables, ignore_index=True)
