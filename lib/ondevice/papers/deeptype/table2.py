"""Table 2 of DeepType (on-device optimisations) from the runs of `deeptype_ondevice_opt`: the
paper's values beside ours, the bucketing comparison, and the measurements that explain where our
size and top-k-eff changes differ from the paper's (a smaller softmax share, shorter histories,
the SVD model's re-training)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice.papers.deeptype import model_size
from ondevice.papers.deeptype.techniques import combined
from ondevice.report import claims, facts

NAME = "deeptype_ondevice_opt"
PAPER, PAPER_TIME = facts.paper(NAME), facts.paper(NAME, "time")  # time: better = the baseline's, so holds = faster
VARIANTS = combined.VARIANTS
TABLE2 = ("baseline", "fine_tune", "svd", "vocab", "bucketing", "combined")
LABEL = {v: spec.label for v, spec in VARIANTS.items()}
# Table 2 per variant, from the facts: top-k-eff, training time (h), model size (MB; None = "/")
PAPER_VALUES = {n.quantity: n.value for n in PAPER.numbers + PAPER_TIME.numbers}
TABLE2_QUANTITIES = ("top-k-eff", "training time (h)", "model size (MB)")
PAPER_TABLE2 = {v: tuple(PAPER_VALUES.get(f"{q}, {LABEL[v]}") for q in TABLE2_QUANTITIES) for v in TABLE2}
USED_WORDS = "words a user has used (median over users)"
SIZE_CLAIMS = {"svd": "layer compression", "vocab": "vocabulary compression", "combined": "all combined"}


def wide(runs: pd.DataFrame, variant: str, column: str) -> np.ndarray:
    """(seeds, users) array of one variant's column."""
    return runs[runs.variant == variant].pivot(index="seed", columns="user", values=column).to_numpy()


def median(runs: pd.DataFrame, variant: str, column: str) -> np.ndarray:  # per seed, over users
    return np.median(wide(runs, variant, column), axis=1)


def table2(runs: pd.DataFrame) -> pd.DataFrame:
    """Table 2 beside ours: medians over users, means over seeds (time ratio: baseline / variant)."""
    eff, size = {v: median(runs, v, "top_k_eff") for v in VARIANTS}, {v: median(runs, v, "size_mb") for v in VARIANTS}
    epoch = {v: wide(runs, v, "epoch_time_seconds") for v in VARIANTS}
    t = pd.DataFrame({"variant": list(VARIANTS), "label": [LABEL[v] for v in VARIANTS]})
    t["top_k_eff"] = [eff[v].mean() for v in VARIANTS]
    t["top_k_eff_change"] = [(eff[v] / eff["baseline"] - 1).mean() for v in VARIANTS]
    t["size_mb"] = [size[v].mean() for v in VARIANTS]
    t["size_change"] = [(size[v] / size["baseline"] - 1).mean() for v in VARIANTS]
    t["padded_fraction"] = [runs[runs.variant == v].padded_fraction.mean() for v in VARIANTS]
    t["steps_per_user"] = [runs[runs.variant == v].steps.mean() for v in VARIANTS]
    t["time_ratio_to_baseline"] = [np.median(epoch["baseline"] / epoch[v], axis=1).mean() for v in VARIANTS]
    paper = pd.DataFrame([PAPER_TABLE2.get(v, (None,) * 3) for v in VARIANTS], dtype=float).to_numpy().T
    (p_eff, p_hours, p_size), (base_eff, base_hours, base_size) = paper, PAPER_TABLE2["baseline"]
    t["paper_top_k_eff"], t["paper_top_k_eff_change"] = p_eff, p_eff / base_eff - 1
    t["paper_size_mb"], t["paper_size_change"] = p_size, p_size / base_size - 1
    t["paper_training_time_h"], t["paper_time_ratio_to_baseline"] = p_hours, base_hours / p_hours
    return t


def bucketing_table(runs: pd.DataFrame) -> pd.DataFrame:
    """The batch sources of Sec. 5.3 side by side: padding, steps, time ratio to fixed length (the
    baseline's batching, `combined`)."""
    fixed, rows = wide(runs, "baseline", "epoch_time_seconds"), []
    for v in ("baseline", "buckets_4", "windows", "bucketing"):
        sub, ratio = runs[runs.variant == v], fixed / wide(runs, v, "epoch_time_seconds")
        label = LABEL[v] if v != "baseline" else "fixed length (30), the baseline"
        rows.append((label, sub.padded_fraction.mean(), sub.steps.mean(), np.median(ratio, axis=1).mean()))
    columns = ["batch source", "padded_fraction", "steps_per_user", "time_ratio_to_fixed_length"]
    return pd.DataFrame(rows, columns=columns)


def displayed(table: pd.DataFrame) -> pd.DataFrame:
    """A table without its timing columns (their values differ run to run; they are saved)."""
    return table[[c for c in table.columns if not any(w in c.lower() for w in ("time", "second"))]]


def log_timing(runs: pd.DataFrame, log=print) -> None:
    """Median epoch times beside the paper's hours, as log lines: timing differs run to run."""
    base, p_base = float(np.median(wide(runs, "baseline", "epoch_time_seconds"))), PAPER_TABLE2["baseline"][1]
    for v in VARIANTS:
        ours, hours = float(np.median(wide(runs, v, "epoch_time_seconds"))), PAPER_TABLE2.get(v, (0, 0))[1]
        paper = f"paper {hours:.2f} h vs {p_base} h ({p_base / hours:.2f}x)" if hours else "paper: not in Table 2"
        log(f"{LABEL[v]}: {paper}; ours, median epoch over users and seeds: {ours:.1f}s, baseline {base:.1f}s")


def plot_table2(table2_df: pd.DataFrame):
    """Table 2's three columns as panels: ours (bars) beside the paper's (black marks)."""
    import matplotlib.pyplot as plt

    t = table2_df[table2_df.variant.isin(TABLE2)].reset_index(drop=True)
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    titles = ("speed-up over baseline (x)", "model size change", "top-k-eff change")
    y = np.arange(len(t))
    for ax, ours, title in zip(axes, ("time_ratio_to_baseline", "size_change", "top_k_eff_change"), titles):
        ax.barh(y, t[ours], color="#d1495b", label="ours")
        paper = pd.to_numeric(t[f"paper_{ours}"], errors="coerce")
        ax.scatter(paper, y, color="black", marker="|", s=250, label="paper", zorder=3)
        ax.set_yticks(y, t.label if ax is axes[0] else [""] * len(t))
        ax.set_title(title)
        ax.invert_yaxis()
    axes[0].axvline(1, color="0.6", lw=1, ls="--")
    axes[0].legend(frameon=False, loc="lower right")
    fig.tight_layout()
    return fig


def softmax_share(model) -> float:
    """The share of the model's parameters in its softmax (kernel and bias): the only layer that
    layer and vocabulary compression cut, so 1 / (1 - share) bounds how much either can shrink it."""
    return model.get_layer("softmax").count_params() / model.count_params()


SECTION = "Why sizes and costs differ from Table 2"


def ranks(readings: pd.DataFrame) -> str:
    """The chosen reading's ranks, as the diagnoses name them (`svd_reading.readings_table`)."""
    main = readings[readings.chosen].iloc[0]
    return f"t={main.softmax_rank}" + (f", embedding t={main.embedding_rank}" if main.embedding_rank else "")


def causes(runs: pd.DataFrame, share: float, readings: pd.DataFrame) -> dict[str, float]:
    """The measurements behind the top-k-eff rows: the softmax's share and the size bound it sets,
    the words a user's history keeps and the test words it loses, and the global model's held-out
    loss unfactored and under the chosen reading at its rules' ranks before and after re-training
    (first seed, `svd_reading`)."""
    base, vocab = runs[runs.variant == "baseline"], runs[runs.variant == "vocab"]
    paper_base, paper_svd = PAPER_TABLE2["baseline"][2], PAPER_TABLE2["svd"][2]
    chosen, rank = readings[readings.chosen].iloc[0], ranks(readings)
    return {
        "softmax share of the parameters": share,
        "largest model shrink from cutting only the softmax": 1 / (1 - share) - 1,
        "paper: the least softmax share its SVD size cut implies": 1 - paper_svd / paper_base,
        "vocabulary size": float(base.output_words.iloc[0]),
        "words kept by vocabulary compression (mean over users)": float(vocab.output_words.mean()),
        "test words outside the global vocabulary": float(base.test_oov_or_unseen_rate.mean()),
        "test words outside the user's kept words": float(vocab.test_oov_or_unseen_rate.mean()),
        "held-out loss, global model": float(chosen.unfactored_holdout_loss),
        f"held-out loss, SVD {rank} before re-training": float(chosen.holdout_loss),
        f"held-out loss, SVD {rank} re-trained": float(chosen.retrained_holdout_loss),
    }


def causes_table(measured: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame(list(measured.items()), columns=["measurement", "value"])


def size_table(runs: pd.DataFrame, ours: dict, rank: int, embedding_rank: int) -> pd.DataFrame:
    """`model_size.table` for our shape (`ours`: words_in, words_out, embedding, hidden, layers)
    and the paper's, at our ranks and the paper's, with the kept words (ours measured, median)."""
    kept = float(np.median(runs[runs.variant == "vocab"].output_words))
    reported = {v: PAPER_TABLE2[v][2] for v in ("baseline", *SIZE_CLAIMS)}
    return model_size.table(ours, rank, kept, PAPER_VALUES[USED_WORDS], reported, embedding_rank)


def reading_sensitivity(runs: pd.DataFrame, other_runs: pd.DataFrame, readings: pd.DataFrame) -> pd.DataFrame:
    """Both readings of the SVD side by side (the main rows' and the other's, `svd_reading`): per
    reading and SVD variant, the compressed global model's ranks, parameters and re-trained held-out loss, and
    the personal models' top-k-eff and size (median over users, mean over seeds) against the baseline."""
    base_eff, base_size, rows = median(runs, "baseline", "top_k_eff"), median(runs, "baseline", "size_mb"), []
    for data in (runs, other_runs):
        for variant in ("svd", "combined"):
            sub = data[data.variant == variant]
            r = readings[readings.reading == sub.svd_reading.iloc[0]].iloc[0]
            eff, size = median(data, variant, "top_k_eff"), median(data, variant, "size_mb")
            rows.append(dict(reading=r.reading, chosen=r.chosen, variant=variant, label=LABEL[variant]))
            rows[-1].update(
                softmax_rank=r.softmax_rank, embedding_rank=r.embedding_rank, global_parameters=r.parameters
            )
            rows[-1].update(retrained_holdout_loss=r.retrained_holdout_loss, within_tolerance=r.within_tolerance)
            rows[-1].update(top_k_eff=eff.mean(), top_k_eff_change=(eff / base_eff - 1).mean())
            rows[-1].update(size_mb=size.mean(), size_change=(size / base_size - 1).mean())
    return pd.DataFrame(rows)


def diagnoses(measured: dict[str, float], readings: pd.DataFrame, sizes: pd.DataFrame, runs) -> dict:
    """One line per size or top-k-eff row of Table 2 whose change can differ from the paper's,
    each quoting the measurement that explains it, and its kind: the size rows from the arithmetic
    on both models under the measured reading (`model_size.diagnosis`), the words a user keeps
    follow their data (data), the top-k-eff cost of layer compression the rules' ranks on our
    matrices (scale)."""
    m, lost, rank = measured, measured["test words outside the user's kept words"], ranks(readings)
    main = readings[readings.chosen].iloc[0]
    words = (
        f"a user's history keeps {m['words kept by vocabulary compression (mean over users)']:,.0f} of "
        f"{m['vocabulary size']:,.0f} words (the paper's users: a median {PAPER_VALUES[USED_WORDS]:,.0f}), "
        f"and {lost:.0%} of test words fall outside them (outside the global vocabulary: "
        f"{m['test words outside the global vocabulary']:.0%}), never to be suggested"
    )
    loss = (
        f"the rules' {rank} ({main.reading}; {'within' if main.within_tolerance else 'none within'} the "
        f"tolerance) take the global model's held-out loss from {m['held-out loss, global model']:.3f} "
        f"(unfactored) to {m[f'held-out loss, SVD {rank} before re-training']:.3f} factored, "
        f"{m[f'held-out loss, SVD {rank} re-trained']:.3f} after re-training to a plateau"
    )
    size = {
        v: float(np.mean(median(runs, "baseline", "size_mb") / median(runs, v, "size_mb") - 1)) for v in SIZE_CLAIMS
    }
    scale, data = claims.Kind.SCALE, claims.Kind.DATA
    return {
        "layer compression shrinks the model": model_size.diagnosis(sizes, "svd", size["svd"], SECTION, main.reading),
        "all combined shrinks the model": model_size.diagnosis(
            sizes, "combined", size["combined"], SECTION, main.reading
        ),
        "vocabulary compression costs top-k-eff": claims.Diagnosis(words, SECTION, data),
        "layer compression costs top-k-eff": claims.Diagnosis(loss, SECTION, scale),
        "all combined costs top-k-eff": claims.Diagnosis(f"both causes at once: {loss}; and {words}", SECTION, scale),
    }
