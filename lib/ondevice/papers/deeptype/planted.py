"""A planted personal signal, the known-answer control of personalization (issue 40): each test and
validation user gets a habit the global text never has, a user-specific word swapped in for each of
the `planted_words` most frequent vocabulary words, in a share (the *dose*) of that user's lines, in
its training and test parts alike. The crowd, the global text and every other user stay as they are.
A protocol that can learn a personal signal must gain on these users, more with a larger dose; at
the dose fixed beforehand (`planted_dose_star`) the gain's interval must be above zero. Every draw
comes from this module's own streams ("planted/...") and changes no other number."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.per_user_text import Corpus
from ondevice.data.typing_samples import Vocabulary
from ondevice.papers.deeptype import protocol
from ondevice.report import claims
from ondevice.report.conclusion import wide
from ondevice.tasks.typing_protocol import DeepTypeParams

PAPER_ENTRIES_PER_USER = "100K entries"  # each user's personal training data (DeepType Sec. 6.1)
SECTION = "Planted-signal control: would this protocol see a personal signal if the data had one?"  # top3eff's
SOURCE_POOL = 2  # targets are drawn from the vocabulary below the first SOURCE_POOL x planted_words words
PRESETS = {"smoke": dict(planted_doses=(0.0, 0.5, 1.0))}  # an experiment's preset layer for `Fields`


@dataclass(frozen=True)
class Fields(DeepTypeParams):
    """The control's fields and its rule, fixed before running (`verdict`), for the experiments that
    derive from it (online training, personal data size)."""

    planted_doses: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0)  # shares of a user's lines with its habit
    planted_dose_star: float = 0.5  # the gain's interval must lie above zero at this dose
    planted_words: int = 20  # the most frequent words each user swaps for its own

    def check(self) -> None:
        super().check()
        check(self)


def check(params) -> None:
    """The control's fields: doses are shares of lines, and the fixed dose is one of them, above 0."""
    params.require(all(0 <= d <= 1 for d in params.planted_doses), "planted_doses", "must be shares in [0, 1]")
    star = 0 < params.planted_dose_star and params.planted_dose_star in params.planted_doses
    params.require(star, "planted_dose_star", "must be a positive dose of planted_doses")
    params.at_least(1, "planted_words")


def habit(vocab: Vocabulary, user: str, seed: int, n_words: int) -> dict[str, str]:
    """The user's habit: each of the `n_words` most frequent words -> a word of the vocabulary's rarer
    part, drawn for this user alone (in-vocabulary, so a model can learn to suggest it)."""
    words = vocab.words[2:]  # without <pad> and <unk>
    if len(words) < (SOURCE_POOL + 1) * n_words:
        raise ValueError(f"a habit of {n_words} words needs {(SOURCE_POOL + 1) * n_words} vocabulary words")
    pool = words[SOURCE_POOL * n_words :]
    targets = streams.rng(seed, f"planted/words/{user}").choice(len(pool), n_words, replace=False)
    return {w: pool[i] for w, i in zip(words[:n_words], targets)}


def plant_user(sents: list[list[str]], swap: dict[str, str], dose: float, user: str, seed: int) -> list[list[str]]:
    """The user's lines with `swap` applied in a `dose` share of them. Each line's draw is the same at
    every dose, so a larger dose plants a superset of a smaller one's lines."""
    if not 0 <= dose <= 1:
        raise ValueError(f"a dose is a share of lines in [0, 1], got {dose}")
    draws = streams.rng(seed, f"planted/lines/{user}").random(len(sents))
    return [[swap.get(w, w) for w in s] if u < dose else list(s) for s, u in zip(sents, draws)]


def planted(corpus: Corpus, dose: float, seed: int, n_words: int) -> Corpus:
    """The corpus with every test and validation user planted at `dose`; its global text, samples,
    vocabulary and split are the same objects, so nothing the global model sees changes."""
    who = set(corpus.split.test) | set(corpus.split.validation)
    users = {
        u: plant_user(s, habit(corpus.vocab, u, seed, n_words), dose, u, seed) if u in who else s
        for u, s in corpus.users.items()
    }
    return dataclasses.replace(corpus, users=users)


def gains(params, plant: Corpus, models, schedule, dose: float, who: list[str], log=print) -> list[dict]:
    """Per seed and user of `who` on `plant` (the corpus planted at `dose`): the global model's top-k-eff
    and the personalized model's (the main protocol: `schedule`, per-user stopping on held-out lines)."""
    rows, personal = [], protocol.Personal(params, models.model)
    for seed in params.seed_list:
        start = models.weights[seed]
        for user in who:
            fit, held, test = plant.personal_parts(user, params)
            before = personal.score_weights(start, test)["top_k_eff"]
            rng = streams.rng(seed, f"personal/{user}")
            after = personal.train((fit, test), start, params, rng, held=held, schedule=schedule(seed))[0]
            row = {"dose": dose, "seed": seed, "user": user, "top_k_eff_global": before}
            rows.append({**row, **{k: v for k, v in after.items() if not k.startswith("_")}})
        log(f"planted dose {dose:g}, seed {seed}: {len(who)} users personalized")
    return rows


def doses(params, corpus: Corpus, measure, main_rows: pd.DataFrame) -> pd.DataFrame:
    """Every dose's per-user rows on the test users: dose 0 is the main run's own rows (`main_rows`:
    seed, user, top_k_eff_global, top_k_eff), not run again; each other dose is `measure(plant, dose)`'s
    rows (the same columns) on the corpus planted at that dose. Any experiment's protocol can be `measure`."""
    rows = [main_rows.assign(dose=0.0)]
    for dose in (d for d in params.planted_doses if d > 0):
        plant = planted(corpus, dose, params.seed, params.planted_words)
        rows.append(pd.DataFrame(measure(plant, dose)).assign(dose=dose))
    return pd.concat(rows, ignore_index=True)


def run(params, corpus: Corpus, models, schedule, main_rows: pd.DataFrame, log=print) -> pd.DataFrame:
    """`doses` of the top-3-eff protocol (`gains`, per-user stopping at `schedule`'s rates)."""
    measure = lambda plant, dose: gains(params, plant, models, schedule, dose, corpus.split.test, log)  # noqa: E731
    return doses(params, corpus, measure, main_rows)


def gain_in_points(after: np.ndarray, before: np.ndarray, rng, n_boot: int, level: float = 0.95) -> tuple:
    """The median over users of (after - before), averaged over seeds, and its paired bootstrap interval
    (users resampled with the same indices in every seed). In points, not relative: planting lowers the
    global model's own score, to 0 on a weak model, where a relative change has no value."""
    diff = np.asarray(after, float) - np.asarray(before, float)  # (seeds, users)
    idx = rng.integers(0, diff.shape[1], size=(n_boot, diff.shape[1]))
    boot = np.median(diff[:, idx], axis=2).mean(axis=0)
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(np.median(diff, axis=1).mean()), float(low), float(high)


def curve(rows: pd.DataFrame, params) -> pd.DataFrame:
    """Per dose: the median top-k-eff of the global and the personalized model, the gain from
    personalization in points with its 95% interval, and (with per-user stopping) the share of user
    runs that kept epoch 0."""
    out = []
    for dose, d in rows.groupby("dose"):
        rng = streams.rng(params.seed, f"bootstrap/planted/{dose:g}")
        after, before = wide(d, "top_k_eff"), wide(d, "top_k_eff_global")
        gain, low, high = gain_in_points(after, before, rng, params.bootstrap)
        medians = {
            "global": float(np.median(before, axis=1).mean()),
            "personal": float(np.median(after, axis=1).mean()),
        }
        out.append(
            {"dose": dose, "users": after.shape[1], **{f"top_k_eff_{k}": v for k, v in medians.items()}}
            | {"gain": gain, "ci low": low, "ci high": high}
            | ({"kept_epoch_0": float(np.mean(d.kept_epoch == 0))} if "kept_epoch" in d else {})
        )
    return pd.DataFrame(out)


def verdict(table: pd.DataFrame, dose_star: float) -> tuple[bool, str]:
    """The rule fixed before the run: the gain's interval at `dose_star` lies above zero, and the gain
    never falls with the dose beyond noise (each dose's interval reaches the previous dose's gain)."""
    t = table.sort_values("dose").reset_index(drop=True)
    star = t[np.isclose(t.dose, dose_star)]
    if star.empty:
        raise ValueError(f"no planted dose {dose_star} in the table (doses: {t.dose.tolist()})")
    above = bool(star["ci low"].iloc[0] > 0)
    falls = [
        f"{b.dose:g} ({b.gain:+.3f}, up to {b['ci high']:+.3f}) below {a.dose:g} ({a.gain:+.3f})"
        for (_, a), (_, b) in zip(t.iloc[:-1].iterrows(), t.iloc[1:].iterrows())
        if b["ci high"] < a.gain
    ]
    passed = above and not falls
    points = "; ".join(
        f"dose {r.dose:g}: {r.gain:+.3f} [{r['ci low']:+.3f}, {r['ci high']:+.3f}]" for _, r in t.iterrows()
    )
    why = f"interval at dose {dose_star:g} {'above' if above else 'not above'} zero"
    why += "; gain falls with the dose at " + ", ".join(falls) if falls else "; the gain does not fall with the dose"
    head = f"**Planted-signal control {'passes' if passed else 'FAILS'}** ({why})"
    return passed, f"{head}. Gain from personalization, top-k-eff (absolute, median over users), per dose: {points}."


def tables(params, per_user: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The control's tables from `doses`' rows: per-user rows of every dose, the gain per dose, the verdict."""
    table = curve(per_user, params)
    passed, text = verdict(table, params.planted_dose_star)
    return {
        "planted": per_user,
        "planted_curve": table,
        "planted_verdict": pd.DataFrame([{"passes": passed, "text": text}]),
    }


def control(params, corpus: Corpus, models, schedule, main_rows: pd.DataFrame, log=print) -> dict[str, pd.DataFrame]:
    """The top-3-eff control's tables (`run`, then `tables`)."""
    return tables(params, run(params, corpus, models, schedule, main_rows, log))


def passed(tables: dict | None) -> bool:
    """Whether this run's control ran and passed (`tables`: `tables`' output, or a dict without it)."""
    verdict = (tables or {}).get("planted_verdict")
    return verdict is not None and bool(verdict.passes.iloc[0])


def known_answer(curve: pd.DataFrame, dose_star: float, words_per_user: float, section: str) -> claims.Diagnosis:
    """The diagnosis of a personalization effect that differs from the paper's once the control has
    passed (`passed`): the protocol gains on a habit planted in the users' lines (`curve`: `curve`'s
    rows), so what it gains on their own lines is what those lines carry. That is the data's: the
    roles of plays stand in for typing logs, with `words_per_user` against the paper's 100K entries."""
    at = lambda dose: curve[np.isclose(curve.dose, dose)].iloc[0]  # noqa: E731
    star, own = at(dose_star), at(0.0)
    text = f"the planted-signal control passes: personalization gains {star.gain:+.3f} "
    text += f"[{star['ci low']:+.3f}, {star['ci high']:+.3f}] top-k-eff on a habit planted in {dose_star:.0%} of a "
    text += f"user's lines and {own.gain:+.3f} on the users' own lines, so the protocol learns a personal signal "
    text += "when the lines carry one, and the roles of plays (our stand-in for typing logs) carry little that the "
    text += f"global model lacks; a test user has a median {words_per_user:,.0f} personal training words "
    text += f"(the paper's users: {PAPER_ENTRIES_PER_USER}, Sec. 6.1)"
    return claims.Diagnosis(text, section, claims.Kind.DATA)
