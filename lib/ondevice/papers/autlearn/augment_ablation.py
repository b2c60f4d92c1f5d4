"""A3's changes taken apart (autlearn_augment_online, issue 26). Adding generated images to
a writer's training set changes two things at once: what the head sees (the crop / rotation /
translation variants) and how long it trains (the same epochs over twice the samples: twice the
steps). As many copies of the originals change only the second. Fewer epochs show whether the sign
depends on how far the head is trained (the paper gives no epochs); one operation alone shows
whether one of the three does it.

Every run trains a writer's head as A3 does (`protocol.PersonalTrainer`, the same start weights and
batch stream) on the same sampled sources as A3 (the same per-writer draw), so the paper's three
operations give A3's own generated images; top-1 on the writer's test images.

The LSTM's change is taken apart the same way at the preset's epochs: EDA's sentences against as
many copies of their source sentences (`CopiesEDA`: EDA's own draws and sampling down, each
generated sentence replaced by the sentence it came from).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.papers.autlearn import augment_choice, protocol
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.techniques import image_augment
from ondevice.report import claims, conclusion

SECTION = "A3: generated samples or extra steps (MobileNet and LSTM)"
ORIGINAL, COPIES, GENERATED = "original images only", "with copies of the originals", "with generated images"
CHANGE = "change vs original only"  # relative change of the mean top-1, at the same epochs


class Copies:
    """An augmenter whose images are their sources unchanged: as many extra samples and steps as
    augmentation, nothing new in them."""

    def transform(self, images: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return np.array(images, copy=True)


class CopiesEDA:
    """EDA with each generated sentence replaced by its source: the same draws, counts and sampling
    down as `eda` (the same rng stream), as many extra sentences and steps, nothing new in them."""

    def __init__(self, eda):
        self.eda = eda

    def augment(self, words: list[str], n_aug: float, rng: np.random.Generator) -> list[list[str]]:
        return [list(words) for _ in self.eda.augment(words, n_aug, rng)]


def text_rows(params, a3_text: pd.DataFrame, copies: pd.DataFrame) -> pd.DataFrame:
    """Per LSTM user: A3's two runs (without, with EDA) and the run with copies (`copies`:
    `cloud_baselines.augmented_steps` with `CopiesEDA`, its "with" rows), as `table` reads them."""
    kinds = [(a3_text, "without", ORIGINAL, "-"), (a3_text, "with", GENERATED, "eda"), (copies, "with", COPIES, "-")]
    epochs = params.text_personal_epochs
    return pd.DataFrame(
        [
            _row(training, ops, epochs, r.user, r.generated_sentences, r.top1)
            for d, condition, training, ops in kinds
            for r in d[d.augmentation == condition].itertuples()
        ]
    )


def text_diagnosis(summary: pd.DataFrame) -> claims.Diagnosis | None:
    """The LSTM augmentation row's diagnosis from its `table`: explained by the extra steps when
    copies of the originals raise top-1 at least as much as EDA's sentences (the rule fixed before
    the run); None, leaving the row unexplained, otherwise."""
    change = summary.set_index("training")[CHANGE]
    generated, copies = change[GENERATED], change[COPIES]
    if not copies >= generated:
        return None
    line = f"the extra steps, not EDA's sentences: change with them {generated:+.1%}, with as many copies of the "
    return claims.Diagnosis(line + f"originals {copies:+.1%} (first seed)", SECTION)


def training_set(params, images, user: str, augmenter=None) -> tuple[tuple[np.ndarray, np.ndarray], int]:
    """A writer's training images plus what `augmenter` makes of them (None: the originals alone)
    and how many it made: `image_augment.augment_images` from the writer's own stream, A3's draw."""
    x, y = images.train[user]
    if augmenter is None:
        return (x, y), 0
    rng = streams.rng(params.seed, f"image-augment/{user}")
    gx, gy = image_augment.augment_images(augmenter, x, y, rng, params.image_n_aug, params.augment_cap)
    return (np.concatenate([x, gx]), np.concatenate([y, gy])), len(gy)


def _label(operations) -> str:
    return " + ".join(operations) if operations else "-"


def runs(params) -> list[tuple[str, str, int]]:
    """(training, operations, epochs) of each run: the three trainings at each of `ablation_epochs`
    and the preset's epochs, then each of the paper's operations alone at the preset's epochs."""
    ours, paper_ops = params.image_personal_epochs, _label(params.image_operations)
    trainings = [(ORIGINAL, "-"), (COPIES, "-"), (GENERATED, paper_ops)]
    grid = [(t, ops, e) for e in sorted({*params.ablation_epochs, ours}) for t, ops in trainings]
    singles = [(GENERATED, op, ours) for op in params.image_operations] if len(params.image_operations) > 1 else []
    return grid + singles


def _augmenter(params, training: str, operations: str):
    """The run's augmenter: none, copies, or the operations at the chosen strength (`augment_choice`)."""
    if training == ORIGINAL:
        return None
    return Copies() if training == COPIES else augment_choice.augmenter(params, tuple(operations.split(" + ")))


def run(params, images, pre, a3: pd.DataFrame | None = None, log=print) -> pd.DataFrame:
    """The summary (`table`) of every run's per-writer rows (`rows`)."""
    return table(params, rows(params, images, pre, a3, log))


def rows(params, images, pre, a3: pd.DataFrame | None = None, log=print) -> pd.DataFrame:
    """Per run and writer: the generated count and top-1. A3's two runs at the preset's epochs
    (original images only, the paper's operations) are taken from `a3` (A3's MobileNet rows) when
    given, as the same training gives the same numbers; the others are trained here."""
    step, out = protocol.PersonalTrainer(params, "image", pre.model), []
    known = {}
    if a3 is not None:
        mobile = a3[a3.model == MODEL_NAMES["image"]].set_index(["augmentation", "user"])
        ours, paper_ops = params.image_personal_epochs, _label(params.image_operations)
        known = {(ORIGINAL, "-", ours): mobile.loc["without"], (GENERATED, paper_ops, ours): mobile.loc["with"]}
    for training, operations, epochs in runs(params):
        if (training, operations, epochs) in known:
            done = known[(training, operations, epochs)]
            made = done.generated_images.fillna(0).astype(int)
            out += [_row(training, operations, epochs, u, made[u], done.top1[u]) for u in images.users]
            continue
        augmenter = _augmenter(params, training, operations)
        for user in images.users:
            train, made = training_set(params, images, user, augmenter)
            step.fit(pre.weights, train, streams.rng(params.seed, f"personal/{user}"), epochs)
            top1 = protocol.score(params, "image", step.model, images.test[user])["top1"]
            out.append(_row(training, operations, epochs, user, made, top1))
        mean = np.mean([r["top1"] for r in out[-len(images.users) :]])
        log(f"MobileNet, {training} ({operations}), {epochs} epochs: mean top-1 {mean:.4f}")
    pre.model.set_weights(pre.weights)
    return pd.DataFrame(out)


def _row(training: str, operations: str, epochs: int, user: str, made: int, top1: float) -> dict:
    run = dict(training=training, operations=operations, epochs=int(epochs))
    return run | dict(user=user, generated_images=int(made), top1=float(top1))


def table(params, per_writer: pd.DataFrame) -> pd.DataFrame:
    """Per run: writers, mean top-1, and the relative change of the mean against the original
    images alone at the same epochs with a paired bootstrap interval over writers."""
    out = []
    for (training, operations, epochs), g in per_writer.groupby(["training", "operations", "epochs"], sort=False):
        base = per_writer[(per_writer.training == ORIGINAL) & (per_writer.epochs == epochs)].set_index("user").top1
        mine = g.set_index("user").top1[base.index]
        row = dict(training=training, operations=operations, epochs=epochs, users=len(mine))
        row |= {"mean top-1": mine.mean(), CHANGE: np.nan, "ci low": np.nan, "ci high": np.nan}
        if training != ORIGINAL and base.mean() > 0 and len(mine) > 1:
            rng = streams.rng(params.seed, f"bootstrap/augment-ablation/{training}/{operations}/{epochs}")
            r = claims.paired_effect(mine.to_numpy(), base.to_numpy(), rng, params.bootstrap, statistic="mean")
            row |= {CHANGE: r["change"], "ci low": r["ci_low"], "ci high": r["ci_high"]}
        out.append(row)
    return pd.DataFrame(out)


def diagnosis(params, summary: pd.DataFrame) -> claims.Diagnosis | None:
    """The MobileNet augmentation row's diagnosis, quoting `summary` (`table`): the change with
    generated images beside the change with copies, by epochs, and each operation alone. None,
    leaving the row unexplained, unless generated images do worse than copies at every epochs and
    lower top-1 at the preset's."""
    ours, paper_ops = params.image_personal_epochs, _label(params.image_operations)
    change = summary.set_index(["training", "operations", "epochs"])[CHANGE]
    epochs = sorted(summary.epochs.unique())
    pairs = {e: (change.get((GENERATED, paper_ops, e), np.nan), change.get((COPIES, "-", e), np.nan)) for e in epochs}
    if not all(g < c for g, c in pairs.values()) or not pairs[ours][0] < 0:
        return None
    by = ", ".join(f"{e}{' (ours)' if e == ours else ''}: {g:+.1%} vs {c:+.1%}" for e, (g, c) in pairs.items())
    line = "the generated images, not their extra steps: change with them vs with as many copies of the originals "
    line += f"by epochs, {by}"
    singles = [(op, change.get((GENERATED, op, ours))) for op in params.image_operations]
    if len(singles) > 1 and all(v is not None for _, v in singles):
        line += "; one operation alone: " + ", ".join(f"{op} {v:+.1%}" for op, v in singles)
    return claims.Diagnosis(line, SECTION)


def diagnose(params, effects: pd.DataFrame, claim: dict[str, str], summary: pd.DataFrame) -> pd.DataFrame:
    """`effects` with diagnosis and section columns, filled for each model's augmentation claim
    (`claim`: model name -> claim) when its diagnosis gives one; `summary` has a model column. Both
    diagnoses are open: they measure what our augmentation does, not a cause outside it."""
    image, text = (summary[summary.model == MODEL_NAMES[k]] for k in ("image", "text"))
    why = {
        MODEL_NAMES["image"]: diagnosis(params, image),
        MODEL_NAMES["text"]: text_diagnosis(text) if len(text) else None,
    }
    out = effects.assign(**claims.NO_DIAGNOSIS)
    for model, d in why.items():
        if d is not None:
            out = conclusion.diagnose(out, claim[model], d)
    return out
