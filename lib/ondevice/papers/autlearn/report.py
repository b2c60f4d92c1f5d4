"""How the AutLearn experiments report (their conclusions go through `report.conclusion`): the
verdicts' text, the tables and claims particular to one experiment (named in each docstring), and
the notebooks' figures (one style)."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd

from ondevice import streams
from ondevice.data.device_traces import AUTONOMOUS, CHARGING, CONDITIONS, FEDERATED
from ondevice.device.energy.base import MODELLED
from ondevice.papers.autlearn.common import MODEL_NAMES
from ondevice.papers.autlearn.techniques import magnitude_pruning, pruning
from ondevice.report import claims, facts
from ondevice.report.conclusion import wide

COLOURS = {AUTONOMOUS: "#00798c", FEDERATED: "#d1495b", CHARGING: "#8c8c8c"}
RED = "#d1495b"


def verdicts(effects: pd.DataFrame, without_number: str) -> str:
    """Markdown: the claims with a paper number through `claims.verdict_text`, then those without one,
    each followed by what the paper says instead (`without_number`)."""
    lines = [claims.verdict_text(effects[effects["paper change"].notna()], None)]
    for _, row in effects[effects["paper change"].isna()].iterrows():
        lines.append(
            f"- **{row['effect']}**: {row['verdict']} in our measurement: {claims.percent(row['our change'])} "
            f"(95% interval {claims.percent(row['ci low'])} to {claims.percent(row['ci high'])}, "
            f"{row['users']} users x {row['seeds']} seed(s); {without_number})."
        )
    return "\n".join(lines)


def accuracy_notes(params, text, images, pre) -> dict:
    """What autlearn_accuracy's run.json records of its users, vocabulary, seeds and choices."""
    notes = dict(text_users=list(text.users), text_users_in_data_set=text.all_users, image_users=len(images.users))
    notes |= dict(image_writers_read=images.all_users, vocabulary_size=text.vocab.size, seeds=params.seed_list)
    notes |= dict(pretrained_lstm_from_cache={s: p.from_cache for s, p in pre["text"].items()})
    return notes | rate_notes(params, text, images)


def rate_notes(params, text, images) -> dict:
    """What run.json records of the on-device rates and the users they were chosen on."""
    return {
        "on_device_rates_chosen": {
            "text": params.text_personal_learning_rate,
            "image": params.image_personal_learning_rate,
        },
        "on_device_epochs_chosen": {"text": params.text_personal_epochs, "image": params.image_personal_epochs},
        "validation_users": {"text": list(text.validation.users), "image": list(images.validation.users)},
        "effects_statistic": "mean over users (paired bootstrap)",
    }


def accuracy_summary(users: pd.DataFrame, methods: tuple[str, ...], rng, n_boot: int) -> pd.DataFrame:
    """autlearn_accuracy: per model and method, the mean top-1 over users (mean over seeds) with a
    95% bootstrap interval over users, the median, and the text model's top-k-eff."""
    out = []
    for kind, model in MODEL_NAMES.items():
        for method in methods:
            m = wide(users, "top1", kind=kind, method=method)  # (seeds, users)
            if not m.size:
                continue
            per_user = m.mean(axis=0)
            boot = per_user[rng.integers(0, len(per_user), (n_boot, len(per_user)))].mean(axis=1)
            ci = [float(q) for q in np.quantile(boot, [0.025, 0.975])]
            row = dict(model=model, method=method, users=m.shape[1], seeds=m.shape[0], top1_mean=float(per_user.mean()))
            row |= dict(top1_ci_low=ci[0], top1_ci_high=ci[1], top1_median=float(np.median(per_user)))
            if kind == "text":
                row["top_k_eff_mean"] = float(wide(users, "top_k_eff", kind=kind, method=method).mean())
            out.append(row)
    return pd.DataFrame(out)


def stopping_table(training: pd.DataFrame) -> pd.DataFrame:
    """autlearn_accuracy: per model, method and seed, where training to convergence stopped: the
    kept epoch or round with its held-out loss and the examples it had seen, the epochs or rounds
    run and their cap, what ended them (the plateau or the cap) and every example seen."""
    rows = []
    for (model, method, seed), g in training.groupby(["model", "method", "seed"], sort=False):
        kept = g[g.kept].iloc[0]
        row = dict(model=model, method=method, seed=seed, unit=kept.unit, kept=int(kept.step))
        row |= dict(kept_holdout_loss=kept.holdout_loss, kept_examples_seen=int(kept.examples_seen))
        row |= dict(kept_epochs_seen=kept.epochs_seen, run=int(g.step.max()), cap=int(kept.cap), ended_by=kept.ended_by)
        rows.append(row | dict(examples_seen=int(g.examples_seen.max()), epochs_seen=g.epochs_seen.max()))
    return pd.DataFrame(rows)


def augment_online_summary(augmented: pd.DataFrame, online: pd.DataFrame) -> pd.DataFrame:
    """autlearn_augment_online: median and mean top-1 per model and condition, over users and seeds."""
    agg = lambda value: dict(median=(value, "median"), mean=(value, "mean"), users=("user", "nunique"))
    stats = lambda table, by, value: table.groupby(["model", by]).agg(**agg(value)).reset_index()
    parts = [
        stats(augmented, "augmentation", "top1")
        .rename(columns={"augmentation": "condition"})
        .assign(experiment="A3 augmentation", part="test part")
    ]
    parts += [
        stats(online, "condition", f"top1_{p}").assign(experiment="A4 online", part=p) for p in ("stream", "last")
    ]
    columns = ["experiment", "model", "part", "condition", "users", "median", "mean"]
    return pd.concat(parts, ignore_index=True)[columns]


def larger_later_text(eff: pd.DataFrame, claims_: dict, stand_in: str) -> str:
    """autlearn_augment_online: the verdict bullets of the claims with a paper number, then the "larger
    later" claims (`claims_[("online", kind, part)]`): our last-part change against our whole-stream
    change (point estimates)."""
    lines = [claims.verdict_text(eff[eff["paper change"].notna()], None)]
    for kind in ("text", "image"):
        stream, last = (eff[eff.effect == claims_[("online", kind, part)][0]].iloc[0] for part in ("stream", "last"))
        larger = "larger" if last["our change"] > stream["our change"] else "not larger"
        lines.append(
            f"- **{MODEL_NAMES[kind]}, larger later** (the paper gives no number): on the last part of the streams "
            f"online learning changes top-1 by {claims.percent(last['our change'])} (95% interval "
            f"{claims.percent(last['ci low'])} to {claims.percent(last['ci high'])}, {last['verdict']}), "
            f"{larger} than over the whole stream ({claims.percent(stream['our change'])})."
        )
    lines.append(
        f"- Our data is **stand-in data** for {stand_in}. Absolute numbers are not comparable with the "
        "paper's; the direction and size of each effect are."
    )
    return "\n".join(lines)


def compression_table(variants: dict) -> pd.DataFrame:
    """autlearn_cost: what each compression (`compression.Compressed`, per kind) leaves: parameters (the
    non-zero ones show magnitude pruning), forward FLOPs per sample, size as float32 and
    zlib-compressed (where sparsity shows), validation top-1 (within the accuracy budget or not, judged
    from `budget_from`: for a re-trained compression the better of the uncompressed model and its
    re-trained copies, `retraining`), and ratios to the uncompressed model."""
    rows = []
    for kind, compressed in variants.items():
        for v in compressed:
            blob, m = b"".join(np.asarray(w, np.float32).tobytes() for w in v.model.get_weights()), v.model
            row = dict(model=MODEL_NAMES[kind], method=v.method, detail=v.detail, parameters=pruning.parameters(m))
            row |= dict(
                nonzero_parameters=magnitude_pruning.nonzero_parameters(m),
                forward_mflops=pruning.forward_flops(m) / 1e6,
            )
            row |= dict(size_mb_float32=len(blob) / 1e6, size_mb_zlib=len(zlib.compress(blob, 6)) / 1e6)
            row |= dict(val_top1=v.val_top1, accuracy_drop=compressed[0].val_top1 - v.val_top1)
            budget_from = compressed[0].val_top1 if v.budget_from is None else v.budget_from
            rows.append(row | dict(budget_from=budget_from, within_budget=v.within_budget))
    table = pd.DataFrame(rows)
    first = table.groupby("model").transform("first")
    for col in ("parameters", "forward_mflops", "size_mb_zlib"):
        table[f"{col}_ratio"] = table[col] / first[col]
    return table


def compiler_effects(params, compiled: pd.DataFrame) -> pd.DataFrame:
    """autlearn_cost: TensorFlow's epoch time over each compiled path's, per model and batch, judged
    like the effects (paired bootstrap over users); every column names time (timings differ per run)."""
    paper_change = 1 / facts.paper("autlearn_cost", "compiler").numbers[0].value - 1
    rows = []
    for (model, batch), sub in compiled.groupby(["model", "batch"]):
        tensorflow = wide(sub, "epoch_time_seconds", path="tensorflow")
        for path in params.compiler_paths[1:]:
            rng = streams.rng(params.seed, f"bootstrap/compiler/{model}/{batch}/{path}")
            r = claims.paired_effect(tensorflow, wide(sub, "epoch_time_seconds", path=path), rng, params.bootstrap)
            row = {"time effect": f"{path} shortens {model}'s epoch (batch {batch})", "paper time change": paper_change}
            row |= {"our time change": r["change"], "ci low (time)": r["ci_low"], "ci high (time)": r["ci_high"]}
            rows.append(row | {"users (time)": r["users"], "verdict (time)": r["verdict"]})
    return pd.DataFrame(rows)


def governor_claims(params, energy: pd.DataFrame) -> pd.DataFrame:
    """autlearn_cost: Fig. 9's directions without numbers: each governor after the first (the
    baseline) makes training take longer and use less energy, per variant (modelled)."""
    baseline, rows = params.governors[0], []
    for g in params.governors[1:]:
        for variant in ("un-optimised", "optimised"):
            checks = (
                (f"{g} lowers the energy of {variant} training", "less energy (Fig. 9)", "energy_j", baseline, g),
                (f"{g} makes {variant} training take longer", "more time (Fig. 9)", "seconds", g, baseline),
            )
            for claim, paper, column, better, worse in checks:
                pair = (wide(energy, column, variant=variant, governor=governor) for governor in (better, worse))
                r = claims.paired_effect(*pair, streams.rng(params.seed, f"bootstrap/{claim}"), params.bootstrap)
                row = {
                    "effect": claim,
                    "label": MODELLED,
                    "paper": paper,
                    "our change": r["change"],
                    "ci low": r["ci_low"],
                }
                rows.append(row | {"ci high": r["ci_high"], "users": r["users"], "verdict": r["verdict"]})
    return pd.DataFrame(rows)


def cost_quantities(epochs: pd.DataFrame, online: pd.DataFrame, energy: pd.DataFrame) -> dict[str, np.ndarray]:
    """autlearn_cost: the per-user values of every quantity the paper names, keyed by its name."""
    out = {}
    for method in ("uncompressed", "structured pruning", "SVD", "magnitude pruning"):
        out[f"epoch time, LSTM, {method}"] = wide(epochs, "epoch_seconds", model="LSTM", method=method)
    for batch in sorted(set(epochs[epochs.model == "MobileNet"].batch)):
        for method in ("uncompressed", "structured pruning"):
            where = dict(model="MobileNet", method=method, batch=batch)
            out[f"epoch time, MobileNet batch {batch}, {method}"] = wide(epochs, "epoch_seconds", **where)
    for model in MODEL_NAMES.values():
        for cache in ("without cache", "with cache"):
            where = dict(model=model, condition=cache)
            out[f"online update time, {model}, {cache}"] = wide(online, "update_seconds", **where)
    for variant in ("un-optimised", "optimised") if energy is not None else ():
        where = dict(variant=variant, governor="performance")
        out[f"energy, LSTM, {variant}, performance"] = wide(energy, "energy_j", **where)
    return out


def flop_quantities(epochs: pd.DataFrame, online: pd.DataFrame) -> dict[str, np.ndarray]:
    """autlearn_cost: `cost_quantities`' keys with counted GFLOPs instead of seconds or joules (the
    energy's un-optimised/optimised are the LSTM's uncompressed/structured-pruning epochs)."""
    counted = epochs.assign(epoch_seconds=epochs.gflops), online.assign(update_seconds=online.gflops)
    work, lstm = cost_quantities(*counted, None), "epoch time, LSTM, "
    energy = {"un-optimised": lstm + "uncompressed", "optimised": lstm + "structured pruning"}
    return work | {f"energy, LSTM, {v}, performance": work[q] for v, q in energy.items()}


NEEDED = "work the paper's change needs removed"


def flops_beside_time(paper: claims.Paper, flops: dict[str, np.ndarray]) -> pd.DataFrame:
    """Per claimed effect: the change the counted FLOPs predict (medians over users, as the time's
    change is read), the share of the work the technique removes, and the share the paper's change
    would need removed (the paper's change from its own numbers)."""
    values, rows = {n.quantity: n.value for n in paper.numbers}, []
    for e in paper.effects:
        change = float(np.median(flops[e.better]) / np.median(flops[e.worse]) - 1)
        wanted = values[e.better] / values[e.worse] - 1
        row = {"effect": e.claim, "paper change": wanted, "FLOP change": change, "work removed": 1 - 1 / (1 + change)}
        rows.append(row | {NEEDED: 1 - 1 / (1 + wanted)})
    return pd.DataFrame(rows)


def flop_diagnosis(row) -> str:
    """One line from a `flops_beside_time` row: what the counted work says about our change."""
    return (
        f"counted FLOPs: the technique removes {row['work removed']:.0%} of the work ({row['FLOP change']:+.0%} "
        f"if time followed FLOPs); the paper's {row['paper change']:+.0%} needs {row[NEEDED]:.0%} removed"
    )


def availability_summary(minutes: pd.DataFrame) -> pd.DataFrame:
    """autlearn_availability: per condition, the median and spread over devices of the minutes per
    day, and the shares of devices with at least the paper's 120 and 60 minutes."""
    rows = []
    for c, g in minutes.groupby("condition", sort=False):
        m = g.minutes_per_day
        row = {"condition": c, "what": CONDITIONS[c], "devices": len(m), "median minutes per day": float(m.median())}
        row |= {"10th percentile": float(m.quantile(0.1)), "90th percentile": float(m.quantile(0.9))}
        rows.append(row | {f"share with at least {n} min": float((m >= n).mean()) for n in (120, 60)})
    return pd.DataFrame(rows)


def finish_summary(params, finish: pd.DataFrame) -> pd.DataFrame:
    """autlearn_availability: the share of devices (x start hours) finishing within the horizon, per
    condition, variant and epochs."""
    rows = []
    for (c, v, e), g in finish.groupby(["condition", "variant", "epochs"], sort=False):
        needed = float(g.training_minutes_needed.median())
        row = {"condition": c, "variant": v, "epochs": e, "devices": len(g)}
        row |= {"median training minutes needed (phone, extrapolated)": needed}
        row |= {f"share finishing within {params.horizon_hours:g} h": float(g.share_within_horizon.mean())}
        rows.append(row | {"devices finishing from every start hour": float((g.share_within_horizon == 1).mean())})
    return pd.DataFrame(rows)


# ---- figures: each takes an experiment's tables and returns a matplotlib figure ------------------


def _finish(fig):
    import seaborn as sns

    sns.despine(fig)
    fig.tight_layout()
    return fig


def plot_methods(users: pd.DataFrame, methods: tuple[str, ...]):
    """Fig. 7 as ours: per model, each user's top-1 per method (mean over seeds), means marked."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    per_user = users.groupby(["model", "method", "user"], as_index=False).top1.mean()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, model in zip(axes, MODEL_NAMES.values()):
        d = per_user[per_user.model == model]
        sns.stripplot(data=d, x="top1", y="method", order=list(methods), color="0.6", size=3, jitter=0.2, ax=ax)
        means = d.groupby("method").top1.mean().reindex(methods)
        ax.scatter(means.values, range(len(methods)), marker="|", s=500, color=RED, zorder=3, label="mean")
        ax.set(title=model, xlabel="top-1 on the user's test part", ylabel="")
        ax.legend(frameon=False, loc="lower right")
    return _finish(fig)


def plot_training(training: pd.DataFrame):
    """autlearn_accuracy: the stopping rule's curves, per model: CloudTrain's and FedAvg's loss on the
    validation users against the examples seen (in epochs of the pooled training data), each kept
    epoch or round ringed."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    scored = training.dropna(subset=["holdout_loss"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, model in zip(axes, MODEL_NAMES.values()):
        d = scored[scored.model == model]
        style = "seed" if d.seed.nunique() > 1 else None
        sns.lineplot(data=d, x="epochs_seen", y="holdout_loss", hue="method", style=style, marker="o", ax=ax)
        kept = d[d.kept]
        ax.scatter(kept.epochs_seen, kept.holdout_loss, s=140, facecolors="none", edgecolors="k", label="kept")
        xlabel = "examples seen (epochs of the pooled training data)"
        ax.set(title=f"{model}: the stopping rule's curves", xlabel=xlabel, ylabel="loss on validation users")
        ax.legend(frameon=False, fontsize=8)
    return _finish(fig)


def plot_curve(curve: pd.DataFrame, params):
    """Cumulative top-1 along each stream, with and without online updates (median over users)."""
    import seaborn as sns

    med = curve.assign(at=(curve.fraction * params.curve_points).round() / params.curve_points)
    med = med.groupby(["model", "condition", "at"], as_index=False).cumulative_top1.median()
    style = dict(
        kind="line", marker="o", palette=["#8c8c8c", RED], height=3.4, aspect=1.15, facet_kws={"sharey": False}
    )
    grid = sns.relplot(data=med, x="at", y="cumulative_top1", hue="condition", col="model", **style)
    for ax in grid.axes.flat:
        ax.axvspan(1 - params.last_fraction, 1, color="0.92", zorder=0)
    grid.set_axis_labels("share of the user's stream seen", "cumulative top-1 (median over users)")
    grid.figure.suptitle("Online learning while the user uses the model", y=1.04)
    return grid.figure


def plot_augmentation(augmented: pd.DataFrame):
    """Per user (mean over seeds): top-1 with augmentation against without (above the diagonal: it helped)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.8))
    for ax, model in zip(axes, ("LSTM", "MobileNet")):
        t = augmented[augmented.model == model].pivot_table(index="user", columns="augmentation", values="top1")
        ax.scatter(t["without"], t["with"], s=18, color="#30638e")
        lo, hi = float(np.nanmin(t.to_numpy())), float(np.nanmax(t.to_numpy()))
        ax.plot([lo, hi], [lo, hi], color="0.6", lw=1)
        ax.set(title=model, xlabel="top-1 without augmentation", ylabel="top-1 with augmentation")
    fig.tight_layout()
    return fig


def plot_times(epochs: pd.DataFrame, compiled: pd.DataFrame, online: pd.DataFrame):
    """Fig. 8 as ratios: each technique's median epoch (or update) time over its baseline's, per
    model; dots are single users."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    rows = []
    sources = (
        (epochs, ["model", "batch"], "method", "uncompressed", "epoch_seconds", "{}"),
        (compiled, ["model", "batch"], "path", "tensorflow", "epoch_time_seconds", "compiler: {}"),
        (online, ["model"], "condition", "without cache", "update_seconds", "inference cache"),
    )
    for table, keys, column, baseline, value, technique in sources:
        for key, sub in table.groupby(keys):
            setting = f"{key[0]} b{key[1]}" if len(keys) == 2 else f"{key[0]} online"
            base = sub[sub[column] == baseline].set_index("user")[value]
            for r in sub[sub[column] != baseline].itertuples():
                ratio = getattr(r, value) / base[r.user]
                rows.append({"setting": setting, "technique": technique.format(getattr(r, column)), "ratio": ratio})
    data = pd.DataFrame(rows)
    fig, ax = plt.subplots(figsize=(9, 4))
    sns.barplot(data=data, x="setting", y="ratio", hue="technique", estimator=np.median, errorbar=None, ax=ax)
    dots = dict(dodge=True, size=3, color="0.2", legend=False, ax=ax)
    sns.stripplot(data=data, x="setting", y="ratio", hue="technique", **dots)
    ax.axhline(1, color="0.5", lw=0.8, ls="--")
    title = "Training time of each technique relative to its baseline"
    ax.set(ylabel="time / baseline's (median over users)", xlabel="", title=title)
    sns.move_legend(ax, "upper left", bbox_to_anchor=(1, 1), frameon=False, fontsize=8)
    return _finish(fig)


def plot_energy(energy: pd.DataFrame):
    """Fig. 9: modelled energy and time, normalised to un-optimised training on `performance`."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (col, what) in zip(axes, (("energy_norm", "energy"), ("time_norm", "training time"))):
        bars = dict(hue="variant", estimator=np.median, errorbar=None, ax=ax, legend=ax is axes[0])
        sns.barplot(data=energy, x="governor", y=col, **bars)
        ax.axhline(1, color="0.5", lw=0.8, ls="--")
        ax.set(ylabel=f"normalised {what}", title=f"LSTM {what} (modelled, {energy.note.iloc[0].split(',')[0]})")
        ax.title.set_fontsize(9)
    return _finish(fig)


def plot_availability(minutes: pd.DataFrame, synthetic: bool):
    """Fig. 2: CDF over devices of minutes per day in each condition, with the paper's medians."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for c, g in minutes.groupby("condition", sort=False):
        x = np.sort(g.minutes_per_day.to_numpy())
        line = dict(where="post", color=COLOURS[c], ls="--" if c == CHARGING else "-", label=f"{c} (ours)")
        ax.step(x, np.arange(1, len(x) + 1) / len(x), **line)
    for n, c in zip(facts.paper("autlearn_availability").numbers, (AUTONOMOUS, FEDERATED)):
        ax.axvline(n.value, color=COLOURS[c], ls=":", lw=1.2, label=f"paper's median, {c}")
    title = "Trainable minutes per day" + (" (synthetic trace)" if synthetic else "")
    ax.set(xlabel="minutes per day in the condition", ylabel="share of devices (CDF)", title=title)
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def plot_finish(finish: pd.DataFrame, params):
    """Left: CDF over devices of the median hours to finish; right: share finishing within the
    horizon vs epochs. Phone times are extrapolations."""
    import matplotlib.pyplot as plt

    styles = {AUTONOMOUS: "-", FEDERATED: "-", CHARGING: "--"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    head = finish[(finish.variant == params.variant) & (finish.epochs == params.personal_epochs)]
    for c, g in head.groupby("condition", sort=False):
        hours = g.median_hours_to_finish.to_numpy()
        x = np.sort(hours[np.isfinite(hours)])  # the rest never finish within the trace: the CDF stays below 1
        left.step(x, np.arange(1, len(x) + 1) / len(hours), where="post", color=COLOURS[c], ls=styles[c], label=c)
    left.axvline(params.horizon_hours, color="k", ls=":", lw=1)
    xlabel = "hours from the model's arrival to a personalised model\n(median over start hours)"
    title = f"{params.variant}, {params.personal_epochs} epochs (phone time extrapolated)"
    left.set(xlim=(0, None), ylim=(0, 1.02), xlabel=xlabel, ylabel="share of devices (CDF)", title=title)
    left.legend(frameon=False, fontsize=8)
    by_epochs = finish[finish.variant == params.variant].groupby(["condition", "epochs"], sort=False)
    grid = by_epochs.share_within_horizon.mean()
    for c in head.condition.unique():
        s = grid.loc[c]
        right.plot(s.index, s.values, marker="o", color=COLOURS[c], ls=styles[c], label=c)
    ylabel, title = f"share finishing within {params.horizon_hours:g} h", "Finishing within a day vs training length"
    right.set(xlabel="personal epochs", ylabel=ylabel, ylim=(0, 1.02), title=title)
    right.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def plot_fedavg_control(training: pd.DataFrame, tolerance: float, centralized: str, shuffled: str):
    """autlearn_accuracy: per model, the first seed's held-out loss of IID FedAvg and of centralized SGD at
    its rate (`centralized`, the control's known answer) against the examples seen; the band is the
    centralized run's kept loss up to the tolerance."""
    import matplotlib.pyplot as plt

    scored = training.dropna(subset=["holdout_loss"])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for ax, model in zip(axes, MODEL_NAMES.values()):
        d = scored[(scored.model == model) & (scored.seed == scored.seed.min())]
        for method in (centralized, shuffled):
            m = d[d.method == method]
            ax.plot(m.epochs_seen, m.holdout_loss, marker="o", label=method)
        kept = d[(d.method == centralized) & d.kept].holdout_loss
        if len(kept):
            band = f"centralized + {tolerance:.0%}"
            ax.axhspan(kept.iloc[0], kept.iloc[0] * (1 + tolerance), color="0.85", label=band)
        xlabel = "examples seen (epochs of the pooled training data)"
        title = f"{model}: IID FedAvg against SGD at its rate"
        ax.set(title=title, xlabel=xlabel, ylabel="loss on validation users")
        ax.legend(frameon=False, fontsize=8)
    return _finish(fig)
