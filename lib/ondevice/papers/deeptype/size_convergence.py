"""How DeepType's data-size models (D2, `experiments/deeptype_data_size.py`) trained, and the control
that tells an untrained LSTM from a small data set: each size's LSTM beside a 2-gram+char counted
on the very same words. A count model has no training to fall short, so an LSTM below its own
n-gram after its plateau rule is reported as not converged (`below_ngram`), never hidden. The
check reads the held-out global text (training-side data); the test users' medians stand beside
it for the reader, and no choice is made on them.

A size below its n-gram is then trained again under the remedies fixed before any run
(`remedy_params`): a patient plateau rule (an epoch counts as improving at a tenth of the main
rule's 1%, so the rate decays later and training runs longer), and that rule with dropout on the
embedding and LSTM outputs (PTB medium's regularization, for a model that overfits little text).
Each size keeps the lowest held-out loss of all its models (`choose`); a size that stays below its
n-gram after every remedy is reported with them all (`remedies_table`), and its diagnosis names
the amount of text, which the remedies could not make up for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from ondevice.metrics import top_k_eff
from ondevice.models.ngram import KneserNey, PrefixFilter, chars_needed
from ondevice.report import claims

BASELINE = "2-gram+char"  # Kneser-Ney 2-gram, suggestions filtered by the typed characters (as the LSTM's are)
SECTION = "Why the sizes differ: kept epochs and the n-gram baseline"
PAPER_SMALLEST = 1_000_000  # words of the paper's smallest training set (Sec. 3.2, Fig. 2)


def ngram(vocab, sentences) -> KneserNey:
    """The 2-gram counted on `sentences` (words outside `vocab` become <unk>, as for the LSTM)."""
    return KneserNey.fit([[vocab.word_id(w) for w in s] for s in sentences], 2, vocab.size)


def ngram_eff(model: KneserNey, samples, prefix: PrefixFilter, k: int) -> float:
    """top-k-eff of the 2-gram+char on `samples`."""
    return top_k_eff(samples.word_len, chars_needed(model, samples, prefix, k, True)[0])


def training(entries: dict) -> pd.DataFrame:
    """One row per (seed, size, epoch): learning rate, training and held-out loss, steps, seconds."""
    columns = ["epoch", "learning_rate", "loss", "holdout_loss", "holdout_top_k_eff", "steps", "seconds"]
    rows = [
        {"seed": seed, "training_words": words, **{c: e.get(c, np.nan) for c in columns}, "from_cache": entry.hit}
        for (seed, words), entry in entries.items()
        for e in entry.info["epochs"]
    ]
    return pd.DataFrame(rows)


def stopping(entries: dict) -> pd.DataFrame:
    """One row per (seed, size): epochs run, the epoch kept, whether the plateau (not the cap) ended
    it, the steps at the starting rate and the rate of the last epoch."""
    rows = []
    for (seed, words), entry in entries.items():
        epochs = entry.info["epochs"]
        start = epochs[0].get("learning_rate", np.nan)
        full = sum(e["steps"] for e in epochs if e.get("learning_rate") == start)
        rows.append({"seed": seed, "training_words": words, "epochs": len(epochs)})
        rows[-1] |= {"kept_epoch": entry.info["kept_epoch"], "plateau": entry.info["plateau"]}
        rows[-1] |= {"full_rate_steps": full, "last_learning_rate": epochs[-1].get("learning_rate", np.nan)}
    return pd.DataFrame(rows)


def control(entries: dict, holdout_ngram: dict[int, float], base: pd.DataFrame, points: pd.DataFrame) -> pd.DataFrame:
    """Per (seed, size): the stopping row, the LSTM's held-out top-k-eff at its kept epoch beside the
    2-gram+char's on the same held-out text (`holdout_ngram`: size -> top-k-eff), both medians
    over the test users (`base`, `points`: kept epochs), and whether the LSTM stays below its n-gram."""
    table = stopping(entries)
    kept = {
        key: next(e for e in entry.info["epochs"] if e["epoch"] == entry.info["kept_epoch"])
        for key, entry in entries.items()
    }
    table["lstm_holdout_top_k_eff"] = [kept[(s, w)].get("holdout_top_k_eff", np.nan) for s, w in _keys(table)]
    table["ngram_holdout_top_k_eff"] = [holdout_ngram.get(w, np.nan) for _, w in _keys(table)]
    lstm = points[points.kept].groupby(["seed", "training_words"]).top_k_eff.median()
    table["lstm_test_median"] = [float(lstm[(s, w)]) for s, w in _keys(table)]
    table["ngram_test_median"] = [float(base[base.training_words == w].top_k_eff.median()) for _, w in _keys(table)]
    table["below_ngram"] = table.lstm_holdout_top_k_eff < table.ngram_holdout_top_k_eff
    table["converged"] = table.plateau & ~table.below_ngram
    return table


def summary_table(points: pd.DataFrame) -> pd.DataFrame:
    """Median over test users per (seed, size, epoch): the points of Fig. 2."""
    summary = points.groupby(["seed", "training_words", "epoch"], as_index=False)[["top_k_eff", "perplexity"]].median()
    return summary.rename(columns={"top_k_eff": "top_k_eff_median", "perplexity": "perplexity_median"})


def medians(points: pd.DataFrame, base: pd.DataFrame) -> pd.DataFrame:
    """Median top-k-eff per size: the LSTM at its kept epoch beside the 2-gram counted on the same words."""
    lstm = points[points.kept].groupby("training_words").top_k_eff.median().rename("LSTM (kept epoch)")
    return pd.concat([lstm, base.groupby("training_words").top_k_eff.median().rename(BASELINE)], axis=1).reset_index()


def _keys(table: pd.DataFrame) -> list[tuple[int, int]]:
    return list(zip(table.seed, table.training_words))


def _median(table: pd.DataFrame, words: int) -> float:
    return float(table[table.training_words == words].top_k_eff.median())


def diagnosis(
    row: dict, checks: pd.DataFrame, base: pd.DataFrame, kept: pd.DataFrame, worse: int, better: int, tried=None
):
    """For an effect the audit rule flags: where each size's LSTM stopped, the same size effect for
    the 2-gram counted on the same words, and the smaller size's LSTM (`kept`: the kept epochs'
    points) beside that 2-gram, with the held-out control (`checks`: `control`). Open while an LSTM
    stays below its n-gram, unless every remedy was tried on it (`tried`: `remedies_table`) and it
    stayed below: then the cause is the amount of text (data), and the remedies are quoted. None
    without `checks` or for a row the audit does not flag."""
    if (
        checks is None
        or claims.audit(row["paper change"], row["our change"], row["ci low"], row["ci high"]) != "unexplained"
    ):
        return None
    s = checks.groupby("training_words").agg(kept=("kept_epoch", "median"), run=("epochs", "median"))
    s = s.join(checks.groupby("training_words")[["plateau"]].all())
    if "below_ngram" in checks:
        s = s.join(checks.groupby("training_words")[["below_ngram"]].any())
    below = lambda w: "; below its 2-gram on held-out text" if s.get("below_ngram", {}).get(w, False) else ""
    stop = "; ".join(
        f"{w:,} words kept epoch {s.kept[w]:g} of {s.run[w]:g} ({'plateau' if s.plateau[w] else 'epoch cap'}{below(w)})"
        for w in (worse, better)
    )
    b, w = _median(base, better), _median(base, worse)
    small = f"the LSTM on {worse:,} words {_median(kept, worse):.3f} against the {BASELINE}'s {w:.3f}"
    text = f"{stop}; {BASELINE} on the same words {w:.3f} -> {b:.3f} ({b / w - 1:+.1%}); {small}"
    below = [x for x in (worse, better) if s.get("below_ngram", {}).get(x, False)]
    remedied = [_remedied(tried, x) for x in below]
    if below and all(remedied):
        data = "; ".join(remedied) + f" (the paper's smallest set: {PAPER_SMALLEST:,} words)"
        return claims.Diagnosis(f"too little text for this LSTM: {data}; {text}", SECTION, claims.Kind.DATA)
    return claims.Diagnosis(text, SECTION, claims.Kind.OPEN)


def remedy_params(params) -> dict:
    """The remedies' parameters, by name: the patient rule (`remedy_min_improvement`), and it with
    dropout (`remedy_dropout`); every other field as the main rule's."""
    patient = dataclasses.replace(params, global_min_improvement=params.remedy_min_improvement)
    dropout = dataclasses.replace(patient, dropout=params.remedy_dropout)
    return {"patient rule": patient, f"patient rule, dropout {params.remedy_dropout:g}": dropout}


MAIN = "main rule"


def kept_holdout_loss(entry) -> float:
    """The held-out loss of the epoch a model keeps."""
    return next(e["holdout_loss"] for e in entry.info["epochs"] if e["epoch"] == entry.info["kept_epoch"])


def choose(entries: dict, tried: dict) -> tuple[dict, dict]:
    """Per (seed, size): the model with the lowest held-out loss at its kept epoch among the main
    rule's (`entries`) and the remedies' (`tried`: key -> name -> entry); ties keep the main rule.
    Returns (key -> entry, key -> its name)."""
    chosen, names = {}, {}
    for key, entry in entries.items():
        options = {MAIN: entry} | tried.get(key, {})
        names[key] = min(options, key=lambda n: (kept_holdout_loss(options[n]), n != MAIN))
        chosen[key] = options[names[key]]
    return chosen, names


def remedies_table(entries: dict, tried: dict, names: dict, holdout_ngram: dict[int, float]) -> pd.DataFrame:
    """One row per (seed, size, model tried): epochs run, kept epoch, held-out loss and top-k-eff at
    the kept epoch, the 2-gram+char's on the same held-out text, and which model the size keeps."""
    rows = []
    for key, entry in entries.items():
        for name, e in ({MAIN: entry} | tried.get(key, {})).items():
            kept = next(x for x in e.info["epochs"] if x["epoch"] == e.info["kept_epoch"])
            fields = e.info.get("fields", {})
            row = dict(seed=key[0], training_words=key[1], model=name, dropout=fields.get("dropout", np.nan))
            row |= dict(min_improvement=fields.get("global_min_improvement", np.nan), epochs=len(e.info["epochs"]))
            row |= dict(kept_epoch=e.info["kept_epoch"], holdout_loss=kept["holdout_loss"])
            row |= dict(
                holdout_top_k_eff=kept.get("holdout_top_k_eff", np.nan), ngram_holdout_top_k_eff=holdout_ngram[key[1]]
            )
            rows.append(row | dict(chosen=names[key] == name))
    table = pd.DataFrame(rows)
    table["below_ngram"] = table.holdout_top_k_eff < table.ngram_holdout_top_k_eff
    return table


def _remedied(tried: pd.DataFrame | None, words: int) -> str | None:
    """The remedies' line of a size that stays below its n-gram after all of them, else None."""
    if tried is None or words not in set(tried.training_words):
        return None
    size = tried[tried.training_words == words]
    if len(size) < 2 or not size.below_ngram.all():
        return None
    effs = ", ".join(f"{m} {v:.3f}" for m, v in size.groupby("model", sort=False).holdout_top_k_eff.median().items())
    ngram = float(size.ngram_holdout_top_k_eff.iloc[0])
    below = f"every model tried stays below the {BASELINE} on held-out text"
    return f"on {words:,} words {below} ({effs}; {BASELINE} {ngram:.3f})"
