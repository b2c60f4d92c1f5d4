"""How the DeepType experiments report: per-user tables, the run record with the tables every run
has (through `report.conclusion`), and the notebooks' figures (one style)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice.data.per_user_text import Corpus
from ondevice.report import claims
from ondevice.report.conclusion import Conclusion

GREY, RED, AMBER, BLUE = "#8c8c8c", "#d1495b", "#edae49", "#5b7ea4"


def rows_table(rows: list[dict]) -> pd.DataFrame:
    """The rows without their private ("_") fields, e.g. the per-word characters kept for pooling."""
    return pd.DataFrame([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])


def pooled(rows: list[dict], by=("seed", "condition")) -> dict[tuple, list[np.ndarray]]:
    """Per group, the rows' per-word arrays ("_chars") concatenated: for top-k-eff over every test word."""
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in by), []).append(r["_chars"])
    return {key: [np.concatenate(parts) for parts in zip(*chars)] for key, chars in groups.items()}


def record(c: Conclusion, corpus: Corpus, tables: dict, wall_time_s: float, models=None, data=None, **notes):
    """The run's record through the conclusion builder, with what every DeepType run records: the
    corpus's table first, the global model cache, notes on vocabulary, crowd, split and seeds, and
    the split itself."""
    tables = {"data": corpus.table(), **tables}
    if models is not None:
        tables.setdefault("global_model_cache", models.cache())
        notes.setdefault("global_models_from_cache", models.from_cache)
    base = {
        "vocabulary_size": corpus.vocab.size,
        "crowd_words": int(sum(map(len, corpus.crowd))),
        "test_users": list(corpus.split.test),
        "split_digest": corpus.split.digest,
        "seeds": c.params.seed_list,
    }
    data = data or [m.summary() for m in corpus.manifests]
    artifacts = {"split.json": corpus.split.to_dict()}
    return c.result(tables, data, corpus.manifest.stand_in_for, wall_time_s, artifacts=artifacts, **(base | notes))


# Figures. Each takes an experiment's tables and returns a matplotlib figure.


def _plt():
    """pyplot and seaborn, imported when a figure is drawn (not by the engine's job processes)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    return plt, sns


def _finish(fig, *axes, legend: str | None = ""):
    """No top and right spines; frameless legends titled `legend` (None: legend removed)."""
    for ax in axes:
        if legend is None:
            ax.get_legend().remove()
        else:
            ax.legend(title=legend, frameon=False)
    _plt()[1].despine(fig)
    fig.tight_layout()
    return fig


def _bars(ax, per_user: pd.DataFrame, x: str, order: list, colors, values: pd.Series | None = None, y="top_k_eff"):
    """A bar per `x` at `values` (default: the median over users), each user a dot, the value printed."""
    values = (per_user.groupby(x)[y].median() if values is None else values).reindex(order)
    ax.bar(range(len(order)), values, color=colors, alpha=0.85)
    _plt()[1].stripplot(data=per_user, x=x, y=y, order=order, color="0.2", size=3, alpha=0.6, ax=ax)
    for i, v in enumerate(values):
        ax.annotate(f"{v:.3f}", (i, v), ha="center", va="bottom", fontsize=8, xytext=(0, 2), textcoords="offset points")


def plot_training(training: pd.DataFrame):
    """Training and hold-out loss per epoch of each global model (the plateau that stops it)."""
    plt, sns = _plt()
    measured = {"loss": "training text", "holdout_loss": "held-out text"}
    long = training.melt(["global_text", "seed", "epoch"], [c for c in measured if c in training], "measured on")
    long["measured on"] = long["measured on"].map(measured)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    sns.lineplot(long, x="epoch", y="value", hue="global_text", style="measured on", marker="o", ax=ax)
    ax.set(title="global models: loss per epoch", ylabel="masked cross-entropy", xticks=sorted(training.epoch.unique()))
    return _finish(fig, ax)


def plot_conditions(users: pd.DataFrame, order: list[str], k: int):
    """D3 (Table 1): median top-k-eff per condition, each test user a dot (mean over seeds)."""
    plt, _ = _plt()
    order = [c for c in order if c in set(users.condition)]
    colors = [GREY if "personal" not in c else AMBER if "tuned" in c else RED for c in order]
    fig, ax = plt.subplots(figsize=(1.4 * len(order) + 1.5, 4.2))
    _bars(ax, users.groupby(["condition", "user"], as_index=False).top_k_eff.mean(), "condition", order, colors)
    ax.set(xlabel="", ylabel=f"top-{k}-eff on the user's later lines", title="Global model x personalization (Table 1)")
    ax.set_xticks(range(len(order)), order, rotation=20, ha="right")
    return _finish(fig)


def plot_groups(groups: pd.DataFrame, paper: claims.Paper, k: int):
    """D5 (Fig. 8): median top-k-eff of global and personalized models per user group, paper beside ours."""
    plt, sns = _plt()
    parts = [n.quantity.split(", ") + [n.value] for n in paper.numbers]  # "top-k-eff, light users, global"
    paper = pd.DataFrame([{"group": g.split()[0], "model": m, "top_k_eff_median": v} for _, g, m, v in parts])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5), sharey=True)
    for ax, data, title in ((axes[0], groups, "ours"), (axes[1], paper, "paper (Kika users; no normal-user numbers)")):
        sns.barplot(
            data,
            x="group",
            y="top_k_eff_median",
            hue="model",
            order=list(groups.group.unique()),
            palette=[GREY, RED],
            ax=ax,
        )
        ax.set(title=title, xlabel="users", ylabel=f"median top-{k}-eff")
    return _finish(fig, *axes)


def plot_gain_vs_data(users: pd.DataFrame, before: str, after: str, k: int):
    """D5: each user's relative top-k-eff change from personalization against their personal training text."""
    plt, sns = _plt()
    index = ["user", "role", "group", "train_words"]
    wide = users[users.condition.isin([before, after])].pivot_table(
        index=index, columns="condition", values="top_k_eff"
    )
    wide = wide.reset_index().assign(gain_pct=lambda d: 100 * (d[after] / d[before] - 1))
    fig, ax = plt.subplots(figsize=(6, 3.8))
    ax.axhline(0, color="0.6", lw=1, ls="--")
    sns.scatterplot(wide, x="train_words", y="gain_pct", hue="group", palette="crest", s=50, ax=ax)
    for r in wide.itertuples():
        ax.annotate(r.role.title(), (r.train_words, r.gain_pct), fontsize=7, xytext=(4, 3), textcoords="offset points")
    ax.set(
        xlabel="personal training words", ylabel=f"top-{k}-eff change (%)", title="Gain from personalization vs data"
    )
    return _finish(fig, ax, legend="users")


def plot_personal_data(summary: pd.DataFrame, users: pd.DataFrame, k: int):
    """D4 (Fig. 7): median top-k-eff of the global model and of each personal data size, with (P-M)
    and without (P-M*) the dynamic vocabulary (bars: seed mean; dots: users)."""
    plt, _ = _plt()
    order = list(dict.fromkeys(summary.sort_values(["data_fraction", "dynamic_vocab"]).condition))
    colors = [GREY if c == "G-M" else RED if c.startswith("P-M ") else AMBER for c in order]
    fig, ax = plt.subplots(figsize=(1.0 * len(order) + 2, 4))
    dots = users.groupby(["condition", "user"], as_index=False).top_k_eff.mean()
    _bars(ax, dots, "condition", order, colors, summary.groupby("condition").top_k_eff_median.mean())
    ax.set(
        xlabel="personal data (share of each user's training part); * = without dynamic vocabulary",
        ylabel=f"top-{k}-eff (median over users; mean of {summary.seed.nunique()} seeds)",
        title="Personal data size and dynamic vocabulary (DeepType Fig. 7)",
    )
    return _finish(fig)


def plot_oov(users: pd.DataFrame):
    """D4: share of test words out of vocabulary with the global and with the user's dynamic vocabulary."""
    plt, sns = _plt()
    names = {"test_oov_global_vocab": "global vocabulary", "test_oov": "user's dynamic vocabulary"}
    dyn = users[users.dynamic_vocab].groupby(["user", "data_fraction"], as_index=False)[list(names)].mean()
    long = dyn.melt(["user", "data_fraction"], var_name="vocabulary", value_name="oov")
    long = long.assign(vocabulary=long.vocabulary.map(names), oov=100 * long.oov)
    fig, ax = plt.subplots(figsize=(6, 3.8))
    sns.pointplot(
        long,
        x="data_fraction",
        y="oov",
        hue="vocabulary",
        estimator="median",
        errorbar=None,
        palette=[GREY, RED],
        dodge=0.2,
        ax=ax,
    )
    ax.set(
        xlabel="personal data (share of the training part)",
        ylabel="test words out of vocabulary (%, median)",
        title="What the dynamic vocabulary brings into reach",
    )
    return _finish(fig, ax)


def plot_data_size(summary: pd.DataFrame, k: int):
    """D2 (Fig. 2): median top-k-eff and perplexity over the test users after each epoch, one line
    per training-set size (mean over seeds)."""
    plt, sns = _plt()
    mean = summary.groupby(["training_words", "epoch"], as_index=False)[
        ["top_k_eff_median", "perplexity_median"]
    ].mean()
    mean["training set"] = mean.training_words.map(lambda w: f"{w:,} words")
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, col, label in ((axes[0], "top_k_eff_median", f"top-{k}-eff"), (axes[1], "perplexity_median", "perplexity")):
        sns.lineplot(mean, x="epoch", y=col, hue="training set", marker="o", palette="crest", ax=ax)
        ax.set(
            ylabel=f"{label} (median over test users)",
            title=f"{label} per epoch (Fig. 2)",
            xticks=sorted(mean.epoch.unique()),
        )
    axes[1].get_legend().remove()
    return _finish(fig, axes[0])


def plot_models(users: pd.DataFrame, order: list[str], k: int):
    """D1 (Fig. 1b): top-k-eff per model (bars: median over users, seed mean for the LSTM; dots:
    users), and the word perplexity of the models that predict words."""
    plt, sns = _plt()
    per_user = users.groupby(["model", "user"], as_index=False)[["top_k_eff", "word_perplexity"]].mean()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    _bars(axes[0], per_user, "model", order, [RED] + [GREY, BLUE] * (len(order) // 2))
    axes[0].set(xlabel="", ylabel=f"top-{k}-eff (test users' later lines)", title="LSTM vs n-grams (Fig. 1b)")
    ppl = per_user.dropna(subset=["word_perplexity"])
    order = [m for m in order if m in set(ppl.model)]
    sns.boxplot(ppl, x="model", y="word_perplexity", order=order, color="0.85", ax=axes[1], fliersize=2)
    axes[1].set(xlabel="", ylabel="word perplexity (per user)", title="next word before any character")
    return _finish(fig)


def plot_online(curve: pd.DataFrame, last_fraction: float, k: int):
    """D7: cumulative top-k-eff along the stream with and without online training (median over
    users, mean over seeds); the shaded part is the stream's last part."""
    plt, sns = _plt()
    med = curve.groupby(["seed", "condition", "fraction"], as_index=False).cumulative_top_k_eff.median()
    med = med.groupby(["condition", "fraction"], as_index=False).cumulative_top_k_eff.mean()
    med["condition"] = med.condition.map({"global": "without online training", "online": "online training"})
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    sns.lineplot(med, x="fraction", y="cumulative_top_k_eff", hue="condition", marker="o", palette=[GREY, RED], ax=ax)
    ax.axvspan(1 - last_fraction, 1, color="0.92", zorder=0)
    ax.set(
        xlabel="share of the user's stream typed",
        ylabel=f"cumulative top-{k}-eff (median over users)",
        title="Online training while the user types",
    )
    return _finish(fig, ax)


def plot_planted(curve: pd.DataFrame, dose_star: float, k: int):
    """The planted-signal control: personalization's gain against the dose, with 95% intervals."""
    plt, _ = _plt()
    t = curve.sort_values("dose")
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    err = [t.gain - t["ci low"], t["ci high"] - t.gain]
    ax.errorbar(t.dose, t.gain, yerr=err, marker="o", color=RED, capsize=4, label="personalized - global")
    ax.axhline(0, color="0.6", lw=1, ls="--")
    ax.axvline(dose_star, color=GREY, lw=1, ls=":", label=f"dose fixed beforehand ({dose_star:g})")
    ax.set(xlabel="dose: share of the user's lines with its habit", ylabel=f"top-{k}-eff gain (absolute)")
    ax.set_title("Planted personal habit: gain from personalization")
    return _finish(fig, ax)


def personal_curves(rows: list[dict]) -> pd.DataFrame:
    """The loss on each user's held-out training lines per personal epoch (0: the start)."""
    keys = ("seed", "user", "condition")
    curves = [
        {**{k: r[k] for k in keys}, "epoch": e, "holdout_loss": v}
        for r in rows
        for e, v in enumerate(r.get("_curve", []))
    ]
    return pd.DataFrame(curves, columns=[*keys, "epoch", "holdout_loss"])


def kept_epochs(users: pd.DataFrame) -> pd.DataFrame:
    """Per trained condition, how many (seed, user) runs kept each epoch (0: the starting weights)."""
    trained = users.dropna(subset=["kept_epoch"]).astype({"kept_epoch": int})
    return pd.crosstab(trained.condition, trained.kept_epoch).add_prefix("epoch_").reset_index()


def plot_personal_curves(curves: pd.DataFrame):
    """Loss on each user's held-out training lines per personal epoch, relative to the start (epoch
    0, the global weights): one thin line per (seed, user), the median thick, per condition."""
    plt, sns = _plt()
    start = curves[curves.epoch == 0].set_index(["seed", "user", "condition"]).holdout_loss
    rel = curves.assign(
        change=curves.holdout_loss / curves.set_index(["seed", "user", "condition"]).index.map(start) - 1
    )
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for _, c in rel.groupby(["condition", "seed", "user"]):
        ax.plot(c.epoch, c.change, color=GREY, alpha=0.25, lw=0.8)
    sns.lineplot(rel, x="epoch", y="change", hue="condition", estimator="median", errorbar=None, marker="o", ax=ax)
    ax.axhline(0, color="black", lw=0.8)
    ax.set(ylabel="held-out loss, change from the start", xticks=sorted(curves.epoch.unique()))
    ax.set(title="personal training: loss on the user's held-out training lines")
    return _finish(fig, ax)
