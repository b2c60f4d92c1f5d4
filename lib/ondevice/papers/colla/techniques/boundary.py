"""The device/cloud boundary (Colla Sec. 3.1, "raw data uploading is not required"), made explicit.

Everything that crosses goes through a `Boundary` as an `Upload` (device -> cloud: the client
model's parameters and the place id of each FC slot, needed to pad its outputs) or a `Download`
(cloud -> device: a cloud model's parameters). Both accept float parameter arrays and one int slot
map only, copy them, and are logged, so a test can check that no device sample ever reached the
cloud side. The CT baseline uploads raw data by definition and does not use this boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _params(arrays) -> tuple[np.ndarray, ...]:
    out = tuple(np.array(a, copy=True) for a in arrays)
    if not all(a.dtype == np.float32 for a in out):
        raise TypeError("only float32 model parameters may cross the device/cloud boundary")
    return out


@dataclass(frozen=True)
class Upload:
    device: str
    parameters: tuple[np.ndarray, ...]  # the client model's weights (what the cloud needs of them)
    slot_places: np.ndarray  # place id per FC slot, -1 = off

    def __post_init__(self):
        object.__setattr__(self, "parameters", _params(self.parameters))
        slots = np.array(self.slot_places, copy=True)
        if slots.ndim != 1 or not np.issubdtype(slots.dtype, np.integer):
            raise TypeError("the slot map must be a 1-D integer array")
        object.__setattr__(self, "slot_places", slots)

    @property
    def size(self) -> int:
        return int(sum(a.size for a in self.parameters))


@dataclass(frozen=True)
class Download:
    parameters: tuple[np.ndarray, ...]
    group: int

    def __post_init__(self):
        object.__setattr__(self, "parameters", _params(self.parameters))


@dataclass
class Boundary:
    """Every crossing, in order: ("up", device, Upload) or ("down", device, Download)."""

    log: list = field(default_factory=list)

    def up(self, upload: Upload) -> Upload:
        if not isinstance(upload, Upload):
            raise TypeError(f"only an Upload may go from a device to the cloud, got {type(upload).__name__}")
        self.log.append(("up", upload.device, upload))
        return upload

    def down(self, device: str, download: Download) -> Download:
        if not isinstance(download, Download):
            raise TypeError(f"only a Download may go from the cloud to a device, got {type(download).__name__}")
        self.log.append(("down", device, download))
        return download

    def uploaded(self) -> int:
        return sum(u.size for d, _, u in self.log if d == "up")
