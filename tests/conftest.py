import os
from pathlib import Path

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
mirror = Path(__file__).resolve().parents[2] / "shared" / "data"
if mirror.is_dir():
    os.environ.setdefault("ONDEVICE_DATA_MIRROR", str(mirror))


@pytest.fixture(scope="session")
def speeches():
    """The real Shakespeare speeches, fetched and verified through the manifest."""
    from ondevice.data.shakespeare import load_speeches

    return load_speeches()
