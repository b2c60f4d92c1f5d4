"""AutLearn A3 (data augmentation) and A4 (online learning), Sec. 3.4 and Sec. 5 after Fig. 7.

A3. AutLearn's on-device step (`protocol.PersonalTrainer`) with and without augmentation of the user's training
part, scored on the test part. Text: EDA (`techniques.eda`, WordNet 3.0 synonyms); images: crop, rotation and
translation (`techniques.image_augment`, their strength chosen on validation writers: `augment_choice`). Up to
`eda_n_aug` / `image_n_aug` generated per original, at most `augment_cap` x the originals (the paper: "at most
1x"). Paper: +0.9% (LSTM), +3.1% (MobileNet); MobileNet's change taken apart: `augment_ablation`.

A4. Online learning emulated as the paper describes it (`online_learning.stream_pass`): a user's data in order
(training part, then test part), each sample predicted (and scored), then buffered; each full buffer of
`online_batch_size` trains the last layer once from the inference's cached features. Against the same start
model without updates. Paper: +5.9% (LSTM), +3.1% (MobileNet), larger later. Text starts from the LSTM
pre-trained on Sent140. Images: the public MobileNet's fresh head is at chance, so, as AutLearn's cloud
pre-trains on public data (Sec. 3.1), the head trains on "public" writers (`image_public_fraction`); the online
update (`online_image_candidates`) is chosen on its own validation writers by online's gain, never on users.

Top-1 throughout (text: the next word before any character is typed; `<unk>` never counts as right);
effects: relative changes of the mean over users, averaged over `seeds` (each seed: its own public models,
draws and batch orders; users, writers' roles and rates follow `seed`), paired bootstrap interval over users,
absolute change beside. Stages, one per notebook section: `load`, `pretrain`, `choose_rates`, `augment_text`,
`augment_images`, `ablation`, `online_text`, `online_images`, `conclude`; `run` calls them all.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data import femnist, wordnet
from ondevice.data.typing_samples import build_samples
from ondevice.papers.autlearn import augment_ablation, cloud_baselines, common, online_learning, protocol, report
from ondevice.papers.autlearn.augment_choice import augmenter, check_strength, choose_strength
from ondevice.papers.autlearn.techniques import eda, image_augment
from ondevice.report import facts, record
from ondevice.report.conclusion import Conclusion, effect_row, wide

NAME = "autlearn_augment_online"
MODELS = common.MODEL_NAMES
PAPER = facts.paper(NAME)
# (technique, kind, part) -> the claim and the paper's quantity it is judged against (None: "larger later", no number)
ONLINE = "online learning raises {} accuracy"
CLAIMS = {
    (technique, kind, part): (claim.format(MODELS[kind]), quantity and quantity.format(MODELS[kind]))
    for technique, part, claim, quantity in (
        ("augmentation", "test", "augmentation raises {} accuracy", "augmentation gain, {}"),
        ("online", "stream", ONLINE + " over the stream", "online learning gain over the stream, {}"),
        ("online", "last", ONLINE + " on the last part of the stream", None),
    )
    for kind in MODELS
}
# The paper's data sets, smaller or re-derived (not the Shakespeare manifest's DeepType stand-in).
STAND_IN = (
    "the paper's full data sets: LEAF Sent140 for pre-training (the mirror holds its 8,692-tweet test "
    "split only), LEAF FEMNIST (105 writers, a 5% sample) and LEAF's Shakespeare users (here the suite's "
    "own reading of the same Project Gutenberg plays)"
)


@dataclass(frozen=True)
class Params(common.AutLearnParams):
    # A3: EDA (Wei and Zou's default rates) and image augmentation, capped at 1x (the paper)
    eda_alpha_sr: float = 0.1
    eda_alpha_ri: float = 0.1
    eda_alpha_rs: float = 0.1
    eda_p_rd: float = 0.1
    eda_operations: tuple[str, ...] = eda.OPERATIONS
    eda_n_aug: float = 5.0  # generated per sentence before the cap ("more than 5x", the paper)
    image_operations: tuple[str, ...] = ("crop", "rotation", "translation")  # the paper's MobileNet choice
    image_n_aug: int = 5
    image_strength: float = 1.0  # x image_augment.STRENGTH, chosen on validation writers (augment_choice)
    image_strength_candidates: tuple[float, ...] = (0.25, 0.5, 1.0, 2.0)
    augment_cap: float = 1.0  # generated samples used: at most this x the original count
    ablation_epochs: tuple[int, ...] = (1, 3)  # MobileNet's change taken apart also at these epochs
    # A4
    online_batch_size: int = 16  # the paper's default
    last_fraction: float = 0.25  # "later": the last quarter of each stream (ours are short)
    image_public_fraction: float = 0.5  # writers whose data trains the cloud head (A4 only)
    image_validation_fraction: float = 0.25  # of those, held out to choose the online update
    online_image_candidates: tuple[str, ...] = online_learning.CANDIDATES  # "optimizer:rate", conservative first
    curve_points: int = 10
    bootstrap: int = 2000
    seeds: int = 1  # repeats of the public models and all training (seed, seed + 1, ...)

    # text_users: 6 at default to fit the CPU budget (A3 trains every user's softmax twice, A4 streams every
    # user's data twice). Smoke: two FEMNIST file pairs (10 writers), all used, so that A4 has public,
    # validation and streaming writers; the head's epochs are chosen (`protocol.choose_step`).
    PRESETS = common.presets(
        {
            "smoke": dict(femnist_pairs=2, image_users=0, bootstrap=300, curve_points=5, seeds=2),
            "default": dict(text_users=6, seeds=3),
        }
    )

    def check(self) -> None:
        super().check()
        self.between("[0, 1]", "eda_alpha_sr", "eda_alpha_ri", "eda_alpha_rs", "eda_p_rd")
        for name, ops in (("eda_operations", eda.OPERATIONS), ("image_operations", image_augment.OPERATIONS)):
            chosen = getattr(self, name)
            self.require(bool(chosen) and set(chosen) <= set(ops), name, f"must be a non-empty subset of {ops}")
        self.positive("eda_n_aug", "augment_cap")
        check_strength(self)
        self.at_least(1, "image_n_aug", "online_batch_size", "seeds")
        self.require(all(e >= 1 for e in self.ablation_epochs), "ablation_epochs", "must be epochs >= 1")
        self.between("(0, 1)", "last_fraction", "image_public_fraction", "image_validation_fraction")
        ok = bool(updates := self.online_image_candidates) and all(map(online_learning.online_candidate, updates))
        self.require(ok, "online_image_candidates", "must list 'sgd:<rate>' or 'adam:<rate>' with positive rates")
        self.at_least(2, "curve_points")
        self.at_least(100, "bootstrap")


@dataclass
class Data:
    text: common.TextData
    images: common.ImageData
    wordnet: wordnet.WordNet
    wordnet_manifest: object

    def table(self) -> pd.DataFrame:
        """The text and image data tables of the shared layer, one below the other."""
        return pd.concat([self.text.table(), self.images.table()], ignore_index=True)


def load(params: Params, log=print) -> Data:
    """The shared AutLearn data (public Sent140, Shakespeare users, FEMNIST writers) and WordNet."""
    text, images = common.load_text(params, log), common.load_images(params, log)
    wn, manifest = wordnet.load()
    log(f"WordNet 3.0: {sum(map(len, wn.index.values())):,} lemma entries")
    return Data(text, images, wn, manifest)


def pretrain(params: Params, data: Data, log=print) -> dict[str, dict[int, common.Pretrained]]:
    """The public pre-trained models per kind and seed (the LSTM from the model cache or trained on Sent140)."""
    return common.pretrained_models(params, data.text, data.images, log)


def choose_rates(params: Params, data: Data, models: dict, log=print) -> tuple[Params, pd.DataFrame]:
    """The on-device rates and epochs, then the image augmentation's strength (`augment_choice`), chosen on the
    validation users (never the test users) with the first seed's models; one table of every candidate."""
    first = {kind: by_seed[params.seed] for kind, by_seed in models.items()}
    params, rates = protocol.choose_steps(params, data.text, data.images, first, log)
    params, strengths = choose_strength(params, data.images, first["image"], log)
    return params, pd.concat([rates, strengths], ignore_index=True)


def _seeds(params: Params, stage):
    """`stage(params, seed)` for every seed (params with its draws and batch orders); tables stacked by seed."""
    outs = [stage(dataclasses.replace(params, seed=s), s) for s in params.seed_list]
    stack = lambda i: pd.concat([o[i].assign(seed=s) for o, s in zip(outs, params.seed_list)], ignore_index=True)
    return tuple(stack(i) for i in range(len(outs[0])))


def make_eda(params: Params, data: Data) -> eda.EDA:
    p = params
    return eda.EDA(data.wordnet.synonyms, p.eda_alpha_sr, p.eda_alpha_ri, p.eda_alpha_rs, p.eda_p_rd, p.eda_operations)


def eda_examples(params: Params, data: Data, n: int = 4) -> pd.DataFrame:
    """What EDA makes of a user's first sentences of at least six words: each operation once."""
    made, rng, user = make_eda(params, data), streams.rng(params.seed, "eda/examples"), data.text.users[0]
    ops = {"sr": "synonym replacement", "ri": "random insertion", "rs": "random swap", "rd": "random deletion"}
    picked = [s for s in data.text.train_sentences[user] if len(s) >= 6][:n]
    rows = [(user, name, " ".join(s), " ".join(made.apply(op, s, rng))) for s in picked for op, name in ops.items()]
    return pd.DataFrame(rows, columns=["user", "operation", "original", "augmented"])


def augment_text(params: Params, data: Data, models: dict, log=print, eda_like=None, seeds=None) -> pd.DataFrame:
    """Per seed (the first `seeds`) and user: the step without and with EDA (or `eda_like`); top-1 on the test part."""
    text, made = data.text, eda_like or make_eda(params, data)

    def one(p: Params, seed: int):
        def augment(user):
            sents, rng = text.train_sentences[user], streams.rng(seed, f"eda/{user}")
            more = eda.augment_corpus(made, sents, rng, p.eda_n_aug, p.augment_cap)
            return build_samples(sents + more, text.vocab, text.context_words), len(more)

        return (cloud_baselines.augmented_steps(p, "text", text, models["text"][seed], augment, "sentences", log),)

    return _seeds(dataclasses.replace(params, seeds=seeds or params.seeds), one)[0]


def augment_images(params: Params, data: Data, models: dict, log=print) -> pd.DataFrame:
    """Per seed and writer: AutLearn's step (the MobileNet head on the writer's LEAF training images) without
    and with crop/rotation/translation at the chosen strength (`augment_choice`); top-1 on the test images."""
    images, augment_ = data.images, augmenter(params)

    def one(p: Params, seed: int):
        augment = lambda user: augment_ablation.training_set(p, images, user, augment_)
        return (cloud_baselines.augmented_steps(p, "image", images, models["image"][seed], augment, "images", log),)

    return _seeds(params, one)[0]


def ablation(params: Params, data: Data, models: dict, image_aug, text_aug, log=print) -> pd.DataFrame:
    """Both augmentation changes taken apart on the first seed (`augment_ablation`), with a model column."""
    first = lambda d: d[d.seed == params.seed]
    image = augment_ablation.run(params, data.images, models["image"][params.seed], first(image_aug), log)
    copies = augment_text(params, data, models, log, augment_ablation.CopiesEDA(make_eda(params, data)), seeds=1)
    text = augment_ablation.table(params, augment_ablation.text_rows(params, first(text_aug), copies))
    return pd.concat([image.assign(model=MODELS["image"]), text.assign(model=MODELS["text"])], ignore_index=True)


def online_text(params: Params, data: Data, models: dict, log=print) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per seed, each user's sentences in order (training part, then test part) through the
    pre-trained LSTM, with and without online updates of its softmax."""
    user_streams = {u: online_learning.text_stream(data.text, u) for u in data.text.users}

    def one(p: Params, seed: int):
        pre = models["text"][seed]
        return online_learning.online_rows(
            p, "text", online_learning.online_trainer(p, "text", pre.model), pre.weights, user_streams, log
        )

    return _seeds(params, one)


def online_images(params: Params, data: Data, models: dict, log=print):
    """Per seed, A4 for MobileNet (`online_learning.online_images`: the cloud's head on public writers, the online
    update chosen on validation writers, the users' streams): the users' rows and curve, the selection table, notes."""
    roles, chosen = online_learning.image_roles(params, data.images), {}
    candidates = params.online_image_candidates

    def one(p: Params, seed: int):
        rows, curve, table, chosen[seed] = online_learning.online_images(
            p, data.images, models["image"][seed], roles, candidates, log
        )
        return rows, curve, table

    rows, curve, table = _seeds(params, one)
    notes = dict(public_writers=len(roles["head"]), validation_writers=len(roles["validation"]))
    notes |= dict(streaming_writers=len(roles["users"]), online_image_update=chosen)
    return rows, curve, table, notes


def effects(params: Params, augmented: pd.DataFrame, online: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Each claim: paired bootstrap over users of the relative change of the mean top-1 (averaged
    over seeds), and each claim's change per seed."""
    numbers, rows, n_boot, per_seed = {n.quantity: n.value for n in PAPER.numbers}, [], params.bootstrap, {}
    sources = {
        "augmentation": (augmented, "augmentation", "with", "without"),
        "online": (online, "condition", "online", "pre-trained"),
    }
    for (technique, kind, part), (claim, quantity) in CLAIMS.items():
        table, column, *pair = sources[technique]
        value = "top1" if technique == "augmentation" else f"top1_{part}"
        better, worse = (wide(table, value, model=MODELS[kind], **{column: c}) for c in pair)
        rng = streams.rng(params.seed, f"bootstrap/{technique}/{kind}/{part}")
        absolute = {"absolute change of the mean": float(better.mean() - worse.mean())}
        first = {"effect": claim, "paper change": numbers.get(quantity, np.nan)}
        rows.append(effect_row(first, better, worse, rng, n_boot, "mean", absolute))
        per_seed[claim] = list(better.mean(axis=1) / worse.mean(axis=1) - 1)
    return pd.DataFrame(rows), per_seed


def conclude(
    params, data, models, examples, augmented, online, curve, image_selection, image_notes, rates, wall_time_s, ablation
) -> record.Result:
    """Tables, headline numbers over seeds, the paper's numbers beside ours, the verdicts and the diagnoses."""
    eff, per_seed = effects(params, augmented, online)
    claim = {MODELS[k]: CLAIMS[("augmentation", k, "test")][0] for k in MODELS}
    c = Conclusion(NAME, params, PAPER)
    eff = c.effect_rows(augment_ablation.diagnose(params, eff, claim, ablation))
    c.headlines({q: per_seed[e] for (_, _, _), (e, q) in CLAIMS.items() if q})
    c.paper_vs_ours({q: float(eff.loc[eff.effect == e, "our change"].iloc[0]) for _, (e, q) in CLAIMS.items() if q})
    tables = dict(data=data.table(), eda_examples=examples, augmentation=augmented, online=online, curve=curve)
    tables |= dict(online_image_selection=image_selection, summary=report.augment_online_summary(augmented, online))
    tables |= dict(pretraining=common.pretraining_table(models), rate_selection=rates, augmentation_ablation=ablation)
    manifests = [m.summary() for m in (*data.text.manifests, data.images.manifest, data.wordnet_manifest)]
    notes = dict(text_users=list(data.text.users), image_users=list(data.images.users), **image_notes)
    cached = {s: m.from_cache for s, m in models["text"].items()}
    notes |= dict(pretrained_lstm_from_cache=cached, femnist_classes=femnist.CLASSES, seeds=params.seed_list)
    notes |= report.rate_notes(params, data.text, data.images)
    return c.result(tables, manifests, STAND_IN, wall_time_s, **notes)


def verdict_text(result: record.Result) -> str:
    return report.larger_later_text(result.tables["effects"], CLAIMS, STAND_IN)


def run(params: Params, log=print) -> record.Result:
    """All stages in order, as the notebook runs them."""
    start = time.perf_counter()
    data = load(params, log)
    models = pretrain(params, data, log)
    params, rates = choose_rates(params, data, models, log)
    examples = eda_examples(params, data)
    text_aug, image_aug = augment_text(params, data, models, log), augment_images(params, data, models, log)
    ablated = ablation(params, data, models, image_aug, text_aug, log)
    augmented = pd.concat([text_aug, image_aug])
    t_rows, t_curve = online_text(params, data, models, log)
    i_rows, i_curve, i_selection, notes = online_images(params, data, models, log)
    online, curve = pd.concat([t_rows, i_rows]), pd.concat([t_curve, i_curve])
    wall = time.perf_counter() - start
    return conclude(params, data, models, examples, augmented, online, curve, i_selection, notes, rates, wall, ablated)
