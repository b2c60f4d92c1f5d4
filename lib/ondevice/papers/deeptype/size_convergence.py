"""How DeepType's data-size models (D2, `experiments/deeptype_data_size.py`) trained, and the control
that tells an untrained LSTM from a small data set: each size's LSTM beside a 2-gram+char counted
on the very same words. A count model has no training to fall short, so an LSTM below its own
n-gram after its plateau rule is reported as not converged (`below_ngram`), never hidden. The
check reads the held-out global text (training-side data); the test users' medians stand beside
it for the reader, and no choice is made on them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice.metrics import top_k_eff
from ondevice.models.ngram import KneserNey, PrefixFilter, chars_needed
from ondevice.report import claims

BASELINE = "2-gram+char"  # Kneser-Ney 2-gram, suggestions filtered by the typed characters (as the LSTM's are)
SECTION = "Why the sizes differ: kept epochs and the n-gram baseline"


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


def _keys(table: pd.DataFrame) -> list[tuple[int, int]]:
    return list(zip(table.seed, table.training_words))


def _median(table: pd.DataFrame, words: int) -> float:
    return float(table[table.training_words == words].top_k_eff.median())


def diagnosis(row: dict, checks: pd.DataFrame, base: pd.DataFrame, kept: pd.DataFrame, worse: int, better: int):
    """For an effect the audit rule flags: where each size's LSTM stopped, the same size effect for
    the 2-gram counted on the same words, and the smaller size's LSTM (`kept`: the kept epochs'
    points) beside that 2-gram, with the held-out control (`checks`: `control`). Open: while an LSTM
    stays below its n-gram the effect is ours, not the data's."""
    if claims.audit(row["paper change"], row["our change"], row["ci low"], row["ci high"]) != "unexplained":
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
    return claims.Diagnosis(text, SECTION, claims.Kind.OPEN)
