"""Colla's tables and figures: Table 1's summary, the best shares, the methods beside the
non-neural baselines, the shared-places measurement, model sizes, and the CDF, per-cycle and cost
figures. Aggregate metrics only (GeoLife's license)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ondevice.data.places import ELSEWHERE
from ondevice.models import mrnn
from ondevice.papers.colla.common import CollaParams, Devices
from ondevice.papers.colla.protocol import BASELINES, CONTEXT, MARKOV, METHODS
from ondevice.report import claims

COST_APPROACHES = ("Same-Whole", "Same-FC", "Customization")  # colla_cost's update approaches


def versus_baselines(last: pd.DataFrame) -> pd.DataFrame:
    """Median accuracy over devices (mean over seeds) of every method beside the per-device Markov
    table's, and whether a neural method falls below it."""
    medians = last.groupby(["method", "seed"]).accuracy.median().groupby("method").mean()
    markov = float(medians[MARKOV])
    rows = [
        {
            "method": m,
            "kind": "neural" if m in METHODS else "baseline",
            "median accuracy": float(medians[m]),
            "minus Markov (device)": float(medians[m]) - markov,
            "below Markov (device)": bool(m in METHODS and medians[m] < markov),
        }
        for m in (*METHODS, *BASELINES)
        if m in medians.index
    ]
    return pd.DataFrame(rows)


def shared_places(devices: Devices, params: CollaParams) -> pd.DataFrame:
    """Per device, over the last test period: the place changes (next place differs from the last
    step's; with `sequence="visits"` every sample is one), how many go to a place seen on other
    devices in their parts 0..cycles, how many to one seen on this device, and how many to no place
    known by then (always a miss). Aggregate counts only."""
    parts, c = list(range(params.cycles + 1)), params.cycles
    seen = {
        u: set(np.unique(devices.samples(u, parts, known_by=c, places_only=True)[1]).tolist()) for u in devices.uids
    }
    rows = []
    for uid in devices.uids:
        others = set().union(*(seen[o] for o in devices.uids if o != uid))
        tx, ty = devices.samples(uid, [c + 1], known_by=c)
        changes = ty[ty != tx[:, -1, 0]]
        rows.append(
            {
                "device": uid,
                "changes": len(changes),
                "to places seen on other devices": int(np.isin(changes, list(others)).sum()),
                "to places seen on this device": int(np.isin(changes, list(seen[uid])).sum()),
                "to no known place": int((changes == ELSEWHERE).sum()),
            }
        )
    return pd.DataFrame(rows)


def shared_share(shared: pd.DataFrame) -> float:
    """The share of all test-time place changes that go to a place seen on other devices."""
    return float(shared["to places seen on other devices"].sum() / max(shared.changes.sum(), 1))


PAPER_DEVICE_SAMPLES = 293  # the paper's sampled top-100 device, one 20-day cycle (Sec. 5.3)


def diagnose(
    effects: pd.DataFrame,
    last: pd.DataFrame,
    controls: pd.DataFrame,
    samples: float,
    inputs: str,
    scale: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """Fill the diagnosis of every effect with this run's measurements (the pages show it where the
    judging at publish flags the row, report/judge.py): the two medians, the samples per
    device and cycle against the paper's sampled device, the known-answer controls and, if run, the
    data-scale probe. The cause is the data (a device's samples per cycle, outside our code) only
    when both controls pass with the inputs the run's models read (`inputs`); otherwise it is open:
    a model that cannot reach the table on its own data is ours to fix."""
    medians = last.groupby(["method", "seed"]).accuracy.median().groupby("method").mean()
    table = controls.set_index(["control", "inputs"])
    said = "; ".join(
        f"{c.split(' ', 1)[0]} {inp}: {r['model accuracy']:.3f} vs Markov {r['Markov accuracy']:.3f} ({r.verdict})"
        for (c, inp), r in table.iterrows()
    )
    mine = table[table.index.get_level_values("inputs") == inputs]
    passing = len(mine) > 0 and bool((mine.verdict == "passes").all())
    scaled = ""
    if scale is not None:
        gaps = scale[scale.inputs == scale.inputs.iloc[0]]
        scaled = f"; CT with {gaps.inputs.iloc[0]} minus the pooled table at " + ", ".join(
            f"{r['share of pooled data']:.2f} of the pooled data {r['model - Markov']:+.3f}" for _, r in gaps.iterrows()
        )
    effects = effects.copy()
    for i, row in effects.iterrows():
        other = row.effect.rsplit(" ", 1)[-1]
        effects.loc[i, ["diagnosis", "diagnosis kind"]] = [
            f"medians Colla {medians['Colla']:.2f} vs {other} {medians[other]:.2f}; a device has a median "
            f"{samples:.0f} samples per cycle (the paper's sampled device {PAPER_DEVICE_SAMPLES}); models read "
            f"{inputs}; controls {said}{scaled}",
            (claims.Kind.DATA if passing else claims.Kind.OPEN).value,
        ]
    return effects


def final(cycles: pd.DataFrame) -> pd.DataFrame:
    """The models at the end of the last cycle, tested on the last period (the paper's Table 1)."""
    return cycles[cycles.cycle == cycles.cycle.max()]


def best_shares(last: pd.DataFrame) -> pd.DataFrame:
    """Share of devices on which each of the paper's methods has the highest accuracy (mean over
    seeds); a tie shares the device equally among the tied methods."""
    rows = []
    for seed, group in last[last.method.isin(METHODS)].groupby("seed"):
        wide = group.pivot(index="device", columns="method", values="accuracy")[list(METHODS)]
        best = wide.to_numpy() == wide.to_numpy().max(axis=1, keepdims=True)
        share = (best / best.sum(axis=1, keepdims=True)).mean(axis=0)
        rows += [{"seed": seed, "method": m, "best share": float(v)} for m, v in zip(METHODS, share)]
    return pd.DataFrame(rows)


def best_shares_all(last: pd.DataFrame) -> pd.DataFrame:
    """Share of devices on which each method or baseline is the most accurate (ties shared), per
    seed and the mean over seeds."""
    methods = [m for m in (*METHODS, *BASELINES) if m in set(last.method)]
    rows = []
    for seed, group in last.groupby("seed"):
        wide = group.pivot(index="device", columns="method", values="accuracy")[methods].to_numpy()
        best = wide == wide.max(axis=1, keepdims=True)
        rows += [
            {"seed": seed, "method": m, "best share": float(v)}
            for m, v in zip(methods, (best / best.sum(axis=1, keepdims=True)).mean(axis=0))
        ]
    frame = pd.DataFrame(rows)
    return frame.groupby("method", sort=False)["best share"].agg(["mean", "min", "max"]).reset_index()


def training_steps(cycles: pd.DataFrame) -> pd.DataFrame:
    """Per neural method: the median fit's epochs and optimizer steps, in all and to the epoch kept,
    the share of fits that kept their starting weights (no epoch lowered the validation loss) and
    that kept their first epoch (the model barely left its start)."""
    fits = cycles[cycles.method.isin(METHODS) & (cycles.epochs > 0)]
    return (
        fits.groupby("method", sort=False)
        .agg(
            fits=("epochs", "size"),
            median_epochs=("epochs", "median"),
            median_steps=("steps", "median"),
            median_steps_to_best=("steps_to_best", "median"),
            share_kept_start=("best_epoch", lambda b: float((b == 0).mean())),
            share_kept_first_epoch=("best_epoch", lambda b: float((b == 1).mean())),
            validation_new_places=("validation_new_places", "mean"),
        )
        .reset_index()
    )


def summary_table(last: pd.DataFrame) -> pd.DataFrame:
    """Table 1's columns per method: best share, mean and median accuracy (means over seeds), and
    the medians of weighted precision and recall."""
    shares = best_shares(last).groupby("method")["best share"].mean()
    stats = (
        last.groupby(["method", "seed"])
        .agg(
            mean_accuracy=("accuracy", "mean"),
            median_accuracy=("accuracy", "median"),
            median_precision=("precision", "median"),
            median_recall=("recall", "median"),
        )
        .groupby("method")
        .mean()
    )
    stats["best share"] = shares
    order = [m for m in (*METHODS, *BASELINES) if m in stats.index]
    return stats.loc[order].reset_index()


def model_sizes(params: CollaParams, devices: Devices) -> pd.DataFrame:
    """C1: parameter counts of both models at the paper's 368 places and at ours."""
    rows = []
    for label, n in (("paper's |V| = 368", 368), (f"ours, |V| = {devices.places}", devices.places)):
        for model, config in (
            ("cloud (heavy)", params.cloud_config(n)),
            ("device (light, FC over every place)", params.device_config(n, customised=False)),
        ):
            rows.append(
                {
                    "places": label,
                    "model": model,
                    "embedding": config.embedding_dim,
                    "hidden": config.hidden_units,
                    **mrnn.parameter_count(config),
                }
            )
    return pd.DataFrame(rows)


COLOURS = {
    "DT": "#8c8c8c",
    "CT": "#edae49",
    "DT-ws": "#00798c",
    "Colla": "#d1495b",
    CONTEXT: "#30638e",
    "most frequent place": "#6a4c93",
    MARKOV: "#2a9d8f",
    "Markov (pooled)": "#264653",
}


def plot_cdfs(last: pd.DataFrame):
    """Fig. 4/5: CDFs over devices of accuracy, weighted precision and recall after the last
    update (all seeds' devices pooled); the non-neural baselines dashed."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6), sharey=True)
    for ax, metric in zip(axes, ("accuracy", "precision", "recall")):
        for m in (*METHODS, *BASELINES):
            values = np.sort(last[last.method == m][metric].to_numpy())
            ax.step(
                values,
                np.arange(1, len(values) + 1) / len(values),
                where="post",
                color=COLOURS[m],
                ls="--" if m in BASELINES else "-",
                lw=2 if m == "Colla" else 1.3,
                label=m,
            )
        ax.set(xlabel=f"{'weighted ' if metric != 'accuracy' else ''}{metric}", xlim=(0, 1))
    axes[0].set_ylabel("share of devices")
    axes[-1].legend(frameon=False, loc="lower right")
    fig.suptitle("Per-device scores after the last update (CDF over devices)")
    fig.tight_layout()
    return fig


def plot_cycles(cycles: pd.DataFrame):
    """Fig. 8: median accuracy over devices after each update, per method (mean over seeds)."""
    import matplotlib.pyplot as plt

    medians = (
        cycles.groupby(["method", "seed", "cycle"]).accuracy.median().groupby(["method", "cycle"]).mean().reset_index()
    )
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for m in (*METHODS, *BASELINES):
        d = medians[medians.method == m]
        ax.plot(d.cycle, d.accuracy, marker="o", color=COLOURS[m], ls="--" if m in BASELINES else "-", label=m)
    ax.set(
        xlabel="update cycle",
        ylabel="median accuracy over devices",
        xticks=sorted(medians.cycle.unique()),
        title="Accuracy after each update",
    )
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def plot_costs(costs: pd.DataFrame, times: pd.DataFrame):
    """Fig. 11b, c and 12a: uploaded parameters and inference FLOPs per cycle (medians over
    devices), and measured training time relative to Same-Whole per timed device."""
    import matplotlib.pyplot as plt

    colours = {"Same-Whole": "#8c8c8c", "Same-FC": "#00798c", "Customization": "#d1495b"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    med = costs.groupby("cycle").median(numeric_only=True)
    for a in COST_APPROACHES:
        axes[0].plot(med.index, med[f"upload {a}"], marker="o", color=colours[a], label=a)
    axes[0].set(
        yscale="log",
        xlabel="update cycle",
        ylabel="parameters uploaded (median device)",
        xticks=list(med.index),
        title="Upload per update",
    )
    axes[0].legend(frameon=False)
    axes[1].plot(med.index, med["flops Same"], marker="o", color=colours["Same-Whole"], label="Same-Whole / Same-FC")
    axes[1].plot(
        med.index, med["flops Customization"], marker="o", color=colours["Customization"], label="Customization"
    )
    axes[1].set(
        xlabel="update cycle",
        ylabel="FLOPs per prediction (median device)",
        xticks=list(med.index),
        title="Inference cost",
    )
    axes[1].legend(frameon=False)
    wide = times.pivot(index="device", columns="approach", values="train_time_seconds")
    for i, a in enumerate(COST_APPROACHES):
        r = wide[a] / wide["Same-Whole"]
        axes[2].scatter(np.full(len(r), i), r, color=colours[a])
    axes[2].axhline(0.1, color="0.6", ls="--", lw=1, label="paper: ~10x less (Customization)")
    axes[2].set(
        xticks=range(3),
        xticklabels=COST_APPROACHES,
        ylabel="training time / Same-Whole",
        ylim=(0, None),
        title="Measured training time (host CPU)",
    )
    axes[2].legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig
