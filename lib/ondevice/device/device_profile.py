"""Device profiles: the JSON timing log `tools/ondevice_runner.py` writes on a phone or board,
read back, and training time on that device extrapolated from it (labelled "extrapolated")."""

from __future__ import annotations

import json
from pathlib import Path

PROFILE_FORMAT = "ondevice-runner-log/1"


def load_device_profile(path: str | Path) -> dict:
    """A runner log (a device profile): checked for the fields extrapolation needs."""
    profile = json.loads(Path(path).read_text())
    if profile.get("format") != PROFILE_FORMAT:
        raise ValueError(
            f"{path}: not a device profile (format {profile.get('format')!r}, expected {PROFILE_FORMAT!r})"
        )
    for key in ("device", "variant", "steady_step_seconds", "mean_length", "batch_size"):
        if key not in profile:
            raise ValueError(f"{path}: device profile lacks {key!r}")
    return profile


def extrapolate_seconds(profile: dict, steps: int, mean_length: float | None = None) -> dict:
    """Training time of `steps` steps on the profiled device, from its steady step time. With
    `mean_length`, the step time is scaled linearly from the profile's mean sequence length (an
    LSTM step's work is proportional to the positions it runs); without, used as measured."""
    step = float(profile["steady_step_seconds"])
    if mean_length is not None:
        step *= float(mean_length) / float(profile["mean_length"])
    return {
        "device": profile["device"],
        "variant": profile["variant"],
        "steps": int(steps),
        "step_seconds": step,
        "seconds": step * steps,
        "label": "extrapolated",
    }
