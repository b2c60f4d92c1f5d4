"""What every AutLearn notebook shares: the parameters, the public data and the personal users, and
the public pre-trained models (the cloud side of AutLearn; the on-device step is in `protocol`).

    text = load_text(params, log)          # Sent140 (public): vocabulary, pre-training samples; Shakespeare
                                           #   users (personal): text.users, text.train[u] / text.test[u]
    images = load_images(params, log)      # FEMNIST writers with LEAF's split: images.train[u] = (x, y)
    lstm = pretrained_text(params, text)   # the LSTM pre-trained on Sent140 only (cached_train)
    cnn = pretrained_image(params, images) # MobileNet v1 with ImageNet weights and a new head
    # .model, .weights (the start weights), .info, .from_cache; text.validation / images.validation:
    # users drawn apart from the test users, on which the on-device rates are chosen

Privacy (the paper's autonomous rule, tested): the cloud side (`TextData.vocab`, `public_train` /
`public_holdout`, the pre-trained models) is computed from public data only; the personal users'
sentences enter `TextData.train` / `test` alone, and the pre-trained model's cache key holds the
public samples' digests, never the users'.

Data at each scale (the paper: the 10% of users with the most data, for both data sets):
- text: the public corpus is LEAF Sent140 (the mirror holds its small test split only, 8,692
  tweets); personal users are LEAF's Shakespeare roles, read as DeepType reads them (the same users),
  the top `text_top_fraction` by words (10%: 137 of 1,369), of which `text_users` are drawn when
  not 0. Each user's sentences split by order: the earlier `personal_train_fraction` train.
- images: LEAF FEMNIST writers with LEAF's 90/10 split per writer. The 10% rule applies at paper
  scale (full FEMNIST through `femnist_dir`); the mirror's 105 writers (a 5% sample) would leave 11
  writers with 187 test images, too few to tell a 1% difference, so smoke and default keep all.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import tensorflow as tf
import tf_keras as keras

from ondevice import params as _params
from ondevice import streams
from ondevice.data import femnist, manifests, per_user_text, sent140
from ondevice.data.splits import split_history
from ondevice.data.typing_samples import UNK_ID, Samples, Vocabulary, build_samples, sentences
from ondevice.engine.stage import fingerprint
from ondevice.models import lstm_lm, mobilenet_v1
from ondevice.params import Params
from ondevice.tasks import inference
from ondevice.tasks.classification import ClassificationTask
from ondevice.tasks.next_word import NextWordTask, position_scores
from ondevice.training.bucketing import EqualLength
from ondevice.training.model_cache import cached_train
from ondevice.training.trainer import Plateau, Trainer

KINDS = ("text", "image")
MODEL_NAMES = {"text": "LSTM", "image": "MobileNet"}
LAST_LAYER = {"text": "softmax", "image": mobilenet_v1.HEAD}
# MobileNet widths with a declared ImageNet weight file (paper: 1.0, declared without a checksum).
MOBILENET_WEIGHTS = {0.25: "mobilenet_v1_imagenet", 1.0: "mobilenet_v1_imagenet_1_0"}

# The paper leaves every field open except the vocabulary (10K), the two LSTM layers, bucketing,
# "last layer only" and the top-10% rule. LSTM: embedding 64 / 96 units at default (near DeepType's
# default sizes, narrower for the CPU budget; paper scale: DeepType's 400 / 400), 3 words of context.
MODEL_PRESETS = {
    "smoke": dict(vocab_size=800, embedding_dim=16, hidden_units=32, context_words=3, image_size=32),
    "default": dict(vocab_size=10000, embedding_dim=64, hidden_units=96, context_words=3, image_size=64),
    "paper": dict(vocab_size=10000, embedding_dim=400, hidden_units=400, context_words=10, image_size=224),
}
# Users at default: 12 of the 131 top-10% Shakespeare roles left after 6 validation users (CPU
# budget), the other 99 of the mirror's 105 FEMNIST writers. MobileNet: alpha 0.25 (the mirror's
# ImageNet weights; paper scale 1.0), 28x28 -> 64x64.
DATA_PRESETS = {
    "smoke": dict(
        text_users=4,
        user_max_words=1000,
        pretrain_max_tweets=1500,
        femnist_pairs=2,
        validation_users=2,
        image_top_fraction=1.0,
    ),
    "default": dict(text_users=12, femnist_pairs=0, image_top_fraction=1.0),
    "paper": dict(text_users=0, image_top_fraction=0.1, mobilenet_alpha=1.0),
}
# Pre-training on Sent140 (Adam 0.002, batch 64, equal-length buckets) until an epoch lowers the loss
# on 10% of the tweets held out by less than 1%, at most `pretrain_epochs` (default 12, about 2 CPU
# minutes per epoch: a one-time cost, cached). The on-device step (`protocol`): LSTM softmax by SGD
# (DeepType's personal optimizer), batch 16 (the paper's); MobileNet head by Adam, batch 16 (the
# phones' batch 1 changes time, not what is learnt). Rates and epochs are chosen together on the
# validation users among the candidates (`protocol.choose_steps`: the highest mean top-1 on their
# later parts); the preset's rate and epochs (default: SGD 0.1 for 2 epochs, Adam 0.03 for 15, what
# the rate choice gave at default with those epochs fixed, rate_selection.csv) serve when nothing is chosen.
TRAINING_PRESETS = {
    "smoke": dict(pretrain_epochs=1, text_personal_epochs=1, image_personal_epochs=5),
    "default": dict(pretrain_epochs=12, text_personal_epochs=2),
    "paper": dict(pretrain_epochs=20),
}
RATE_PRESETS = {
    "smoke": dict(text_rate_candidates=(0.1, 1.0), image_rate_candidates=(0.003, 0.03))
    | dict(text_epoch_candidates=(1, 2), image_epoch_candidates=(5, 10)),
    "default": dict(text_personal_learning_rate=0.1, image_personal_learning_rate=0.03),
}
PRESETS = _params.presets(
    MODEL_PRESETS, DATA_PRESETS, TRAINING_PRESETS, RATE_PRESETS, {s: dict(image_users=0) for s in _params.SCALES}
)


def presets(extra: dict[str, dict]) -> dict[str, dict]:
    """An experiment's presets: the shared layers plus its own (`ondevice.params.presets`)."""
    return _params.presets(PRESETS, extra)


@dataclass(frozen=True)
class AutLearnParams(Params):
    """Fields every AutLearn notebook has; an experiment subclasses it with its own."""

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
    # on-device rates and epochs tried on the validation users (`protocol.choose_step`; the more
    # conservative first: ties go to it); empty = keep the preset's rate / epochs
    text_rate_candidates: tuple[float, ...] = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
    image_rate_candidates: tuple[float, ...] = (0.0003, 0.001, 0.003, 0.01, 0.03, 0.1)
    text_epoch_candidates: tuple[int, ...] = (1, 2, 3, 5)
    image_epoch_candidates: tuple[int, ...] = (5, 10, 15, 30)

    def check(self) -> None:
        self.at_least(1, *"embedding_dim hidden_units lstm_layers k pretrain_epochs pretrain_batch_size".split())
        self.at_least(1, "text_personal_batch_size", "image_personal_batch_size")
        self.at_least(0, *"text_users user_max_words validation_users image_users femnist_pairs".split())
        self.at_least(0, "pretrain_max_tweets", "context_words", "text_personal_epochs", "image_personal_epochs")
        self.between("(0, 1]", "text_top_fraction", "image_top_fraction")
        self.between("(0, 1)", "personal_train_fraction", "pretrain_holdout_fraction")
        self.between("[0, 1)", "pretrain_min_improvement")
        self.require(self.vocab_size >= 3, "vocab_size", "must be at least 3 (<pad>, <unk> and a word)")
        self.require(self.k < self.vocab_size - 2, "k", "must be smaller than the number of words in the vocabulary")
        widths = f"must be a width with declared ImageNet weights, one of {sorted(MOBILENET_WEIGHTS)}"
        self.require(self.mobilenet_alpha in MOBILENET_WEIGHTS, "mobilenet_alpha", widths)
        self.require(self.image_size >= 32, "image_size", "must be at least 32 (MobileNet's smallest input)")
        self.positive("pretrain_learning_rate", "text_personal_learning_rate", "image_personal_learning_rate")
        for name in ("text_rate_candidates", "image_rate_candidates"):
            self.require(all(c > 0 for c in getattr(self, name)), name, "must hold positive learning rates")
        for name in ("text_epoch_candidates", "image_epoch_candidates"):
            self.require(all(c >= 1 for c in getattr(self, name)), name, "must hold epochs >= 1")
        for name in ("text_personal_optimizer", "image_personal_optimizer"):
            self.require(getattr(self, name) in ("sgd", "adam"), name, "must be 'sgd' or 'adam'")
        for name in ("corpus", "sent140_dir", "femnist_dir"):
            exists = not getattr(self, name) or Path(getattr(self, name)).exists()
            self.require(exists, name, "must name an existing file or directory, or be empty")

    def at_least(self, minimum: float, *names: str) -> None:
        for name in names:
            self.require(getattr(self, name) >= minimum, name, f"must be at least {minimum}")

    def between(self, interval: str, *names: str) -> None:
        """Each field within `interval`, written as in mathematics: "(0, 1]" is 0 < x <= 1."""
        low, high = (float(v) for v in interval[1:-1].split(","))
        for name in names:
            x = getattr(self, name)
            inside = (low < x if interval[0] == "(" else low <= x) and (x < high if interval[-1] == ")" else x <= high)
            self.require(inside, name, f"must be in {interval}")

    def positive(self, *names: str) -> None:
        for name in names:
            self.require(getattr(self, name) > 0, name, "must be positive")


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
        samples = lambda part, users: {u: build_samples(part[u], self.vocab, self.context_words) for u in users}
        self.train, self.test = samples(self.train_sentences, self.users), samples(self.test_sentences, self.users)
        held = self.validation_users
        self.validation = Validation(held, samples(self.train_sentences, held), samples(self.test_sentences, held))

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

        words = lambda part: sum(len(w) for u in self.users for w in part[u])
        n, pub = len(self.users), len(self.public_train) + len(self.public_holdout)
        rows = [
            row("Sent140 (public): pre-training", "", [self.public_train], len(self.public_train)),
            row("Sent140 (public): held out for the plateau", "", [self.public_holdout], len(self.public_holdout)),
            row("personal users: training part", n, list(self.train.values()), words(self.train_sentences)),
            row("personal users: test part", n, list(self.test.values()), words(self.test_sentences)),
        ]
        return pd.DataFrame(rows).assign(public_words=pub)


def public_sentences(params: AutLearnParams, tweets: dict[str, list[str]] | None = None):
    """Sent140's sentences split into (training, held-out) by tweet at random, and the files read.
    `tweets` (user -> texts) replaces the data set (tests)."""
    files: list[Path] = []
    if tweets is None:
        tweets, files = sent140.load(params.sent140_dir)
    texts = [t for user in sorted(tweets) for t in tweets[user]]
    order = streams.rng(params.seed, "autlearn/sent140").permutation(len(texts))
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
    manifest, users = per_user_text.read_users(params.corpus, speeches)
    sizes = {u: sum(map(len, s)) for u, s in users.items()}
    p = params
    chosen, held = top_users(
        sizes, p.text_top_fraction, p.text_users, p.validation_users, p.seed, "autlearn/text-users"
    )
    train, test = {}, {}
    for u in chosen + held:
        sents = _first_words(users[u], params.user_max_words)
        train[u], test[u] = split_history(sents, [len(s) for s in sents], params.personal_train_fraction)
    public_samples = [build_samples(s, vocab, params.context_words) for s in (public, held_out)]
    sent140_manifest, n = manifests.load("sent140"), len(users)
    data = TextData(
        manifest, sent140_manifest, files, vocab, *public_samples, chosen, train, test, p.context_words, n, held
    )
    log(
        f"public Sent140: {sum(map(len, public))} + {sum(map(len, held_out))} held-out words, vocabulary {vocab.size}; "
        f"personal: {len(chosen)} of {len(users)} users (top {params.text_top_fraction:.0%} by words"
        f"{f', {params.text_users} drawn' if params.text_users else ''}; {len(held)} more for validation), "
        f"{sum(len(s) for s in data.train.values())} training / {sum(len(s) for s in data.test.values())} test words"
    )
    return data


def text_model(params: AutLearnParams, data: TextData, seed: int) -> keras.Model:
    p = params
    config = lstm_lm.LSTMConfig(data.vocab.input_size, data.vocab.size, p.embedding_dim, p.hidden_units, p.lstm_layers)
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

    def digest(self) -> str:
        """What a resumable stage counts (`engine.stage`): the start weights, not whether they came
        from the cache (a resumed run finds in the cache what its first sitting trained)."""
        return fingerprint(self.weights)


PRETRAIN_FIELDS = tuple(
    "vocab_size embedding_dim hidden_units lstm_layers context_words pretrain_epochs pretrain_batch_size k "
    "pretrain_learning_rate pretrain_holdout_fraction pretrain_min_improvement pretrain_max_tweets sent140_dir".split()
)
PRETRAIN_CODE = (
    "ondevice.training.trainer",
    "ondevice.tasks.next_word",
    "ondevice.models.lstm_lm",
    "ondevice.streams",
    "ondevice.training.bucketing",
)


def pretrained_text(params: AutLearnParams, data: TextData, log=print, seed: int | None = None) -> Pretrained:
    """The LSTM pre-trained in the cloud on public Sent140 text only (Adam, equal-length buckets)
    through `Trainer.fit`, stopping at the first epoch that lowers the held-out public loss by less
    than `pretrain_min_improvement` (relative) and keeping the epoch with the lowest loss
    (`Plateau(1, pretrain_min_improvement, keep_lowest=True)`). From the model cache when it exists
    (keyed by the fields, the PUBLIC samples' digests and the training code: no personal data can
    enter the key or the model)."""
    seed = params.seed if seed is None else seed
    model, task = text_model(params, data, seed), NextWordTask(params.k)

    def train():
        trainer = Trainer(model, task, params.pretrain_learning_rate, "adam", hooks=[EqualLength()])
        holdout_loss = lambda m: {"holdout_loss": float(np.log(task.evaluate(m, data.public_holdout)["perplexity"]))}
        stop = Plateau(1, params.pretrain_min_improvement, keep_lowest=True)
        rng, label = streams.rng(seed, "batches/autlearn-pretrain"), f"pre-training on Sent140 (seed {seed})"
        history = trainer.fit(
            data.public_train, params.pretrain_epochs, params.pretrain_batch_size, rng, log, label, holdout_loss, stop
        )
        return model.get_weights(), {"history": list(history), "best_epoch": history.best_epoch}

    fields = {name: getattr(params, name) for name in PRETRAIN_FIELDS} | {"seed": seed}
    digests = [a.sha256 for a in data.public_manifest.artifacts]
    digests += [data.public_train.digest(), data.public_holdout.digest()]
    entry = cached_train("autlearn_lstm_sent140", fields, digests, PRETRAIN_CODE, train, log, (pretrained_text,))
    model.set_weights(entry.weights)
    return Pretrained(model, entry.weights, entry.info, entry.hit)


def score_text(model, samples: Samples, k: int, batch_size: int = 256) -> dict:
    """top1 (`top1_text`) plus DeepType's top-k-eff and the perplexity over all positions."""
    scores = NextWordTask(k, batch_size).evaluate(model, samples)
    top1 = top1_text(model, samples, batch_size)
    return {"top1": top1, "top_k_eff": scores["top_k_eff"], "perplexity": scores["perplexity"]}


def top1_text(model, samples: Samples, batch_size: int = 256) -> float:
    """Share of samples with a previous word whose next word, predicted before any of its characters
    is typed, is the first suggestion (<unk> never counts as right, as a keyboard cannot show it).
    The softmax runs at that one position of each sample, not at all of them: it is most of the
    forward pass, and the budget checks of a compression search call this hundreds of times."""
    features, head = _last_position_parts(model)
    forward, hits, with_context = inference(features), 0, np.flatnonzero(samples.n_context > 0)
    for start in range(0, len(with_context), batch_size):
        idx = with_context[start : start + batch_size]
        x, y = samples.padded(idx)
        at = samples.n_context[idx] - 1
        h = tf.gather(forward(x), at, batch_dims=1)
        for layer in head:
            h = layer(h, training=False)
        hit, _ = position_scores(h[:, None, :], tf.constant(y[np.arange(len(idx)), at][:, None]), tf.constant(1))
        hits += int(hit.numpy().sum())
    return hits / len(with_context) if len(with_context) else float("nan")


_PARTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _last_position_parts(model) -> tuple[keras.Model, list]:
    """(the model up to its last recurrent layer, the layers after it), once per model, so its
    forward pass is traced once (`tasks.inference`) however often it is scored."""
    parts = _PARTS.get(model)
    if parts is None:
        # walked back from this model's output: a layer shared with another model (a pruned copy)
        # has an output per model, and `layer.output` is the first model's
        tensor, head = model.outputs[0], []
        while not isinstance(tensor._keras_history.layer, keras.layers.RNN):
            layer, node = tensor._keras_history.layer, tensor._keras_history.node_index
            tensor, head = layer._inbound_nodes[node].keras_inputs[0], [layer, *head]
        parts = _PARTS[model] = (keras.Model(model.inputs, tensor), head)
    return parts


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

    def pooled(self, users=None, parts=("train",)) -> tuple[np.ndarray, np.ndarray]:
        """The images of `users` (default: every test writer) in `parts` as one set (CloudTrain's
        data with the training parts), in the order of the users, then of the parts."""
        sets = [getattr(self, part)[u] for u in (self.users if users is None else users) for part in parts]
        return np.concatenate([s[0] for s in sets]), np.concatenate([s[1] for s in sets])

    def pooled_train(self) -> tuple[np.ndarray, np.ndarray]:
        return self.pooled()

    def table(self) -> pd.DataFrame:
        rows = []
        for part, d in (("training (LEAF's 90%)", self.train), ("test (LEAF's 10%)", self.test)):
            n = [len(d[u][1]) for u in self.users]
            classes = int(len(np.unique(np.concatenate([d[u][1] for u in self.users]))))
            values = (f"FEMNIST writers: {part}", len(self.users), int(sum(n)), int(min(n)), float(np.median(n)))
            keys = ("data", "users", "images", "per_user_min", "per_user_median")
            rows.append({**dict(zip(keys, values)), "per_user_max": int(max(n)), "classes_seen": classes})
        return pd.DataFrame(rows).assign(writers_read=self.all_users)


def load_images(params: AutLearnParams, log=print) -> ImageData:
    """FEMNIST writers (`femnist_pairs` LEAF file pairs), the top `image_top_fraction` by images
    (then `image_users` drawn at random when not 0), with LEAF's own split."""
    train, test, files = femnist.load(params.femnist_dir, params.femnist_pairs)
    sizes = {u: len(train[u][1]) + len(test[u][1]) for u in train}
    p = params
    chosen, held = top_users(
        sizes, p.image_top_fraction, p.image_users, p.validation_users, p.seed, "autlearn/image-users"
    )
    part = lambda d, users: {u: d[u] for u in users}
    validation = Validation(held, part(train, held), part(test, held))
    data = ImageData(
        manifests.load("femnist"), files, chosen, *(part(d, chosen) for d in (train, test)), len(train), validation
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


def pretrained_image(params: AutLearnParams, data: ImageData | None = None, log=print, seed=None) -> Pretrained:
    """MobileNet v1 with the ImageNet weights (the public pre-trained model: nothing is trained on
    users, nothing is trained here at all) and a new `logits` head over FEMNIST's 62 classes, its
    initial weights drawn from the seed's own stream."""
    seed = params.seed if seed is None else seed
    manifest, path = mobilenet_weights(params)
    alpha, size = params.mobilenet_alpha, params.image_size
    model = mobilenet_v1.build(path, alpha, size, femnist.CLASSES, seed=streams.tf_seed(seed, "init/autlearn-head"))
    log(
        f"MobileNet v1 (alpha {alpha}) with ImageNet weights from {path.name}; "
        f"input 28x28 grey -> {size}x{size} RGB; new {femnist.CLASSES}-class head"
    )
    return Pretrained(model, model.get_weights(), {"weights": manifest.summary()}, from_cache=False)


def pretrained_models(params: AutLearnParams, text: TextData, images, log=print) -> dict[str, dict[int, Pretrained]]:
    """The public pre-trained models per kind ("text", "image") and seed: the LSTM on Sent140 (model
    cache), MobileNet with the ImageNet weights."""
    return {
        "text": {s: pretrained_text(params, text, log, s) for s in params.seed_list},
        "image": {s: pretrained_image(params, images, log, s) for s in params.seed_list},
    }


def pretraining_table(models: dict[str, dict[int, Pretrained]]) -> pd.DataFrame:
    """The LSTM's pre-training curve of every seed."""
    return pd.concat([m.history().assign(seed=s) for s, m in models["text"].items()], ignore_index=True)


def image_features(model: keras.Model, x: np.ndarray, batch_size: int = 256) -> np.ndarray:
    """The pooled MobileNet features (the head's input) of images x under the model's current weights."""
    features = mobilenet_v1.feature_model(model)
    return np.concatenate(
        [features(x[i : i + batch_size], training=False).numpy() for i in range(0, len(x), batch_size)]
    )


def image_task() -> ClassificationTask:
    return ClassificationTask((femnist.SIDE, femnist.SIDE, 1), femnist.CLASSES)


def score_image(model: keras.Model, data: tuple[np.ndarray, np.ndarray]) -> dict:
    """top1 accuracy (and loss) of a writer's images."""
    r = image_task().evaluate(model, data)
    return {"top1": r["accuracy"], "loss": r["loss"]}
