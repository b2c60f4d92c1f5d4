"""Provenance: which code, packages and hardware a result came from."""
from __future__ import annotations

import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

from .. import REPO_ROOT

PACKAGES = ("tensorflow", "tf-keras", "tensorflow-model-optimization", "numpy", "pandas", "seaborn",
            "papermill", "ondevice")


CODE_PATHS = ("lib", "notebooks", "data_manifests", "requirements.lock", "pyproject.toml")


def git_state() -> dict:
    """The commit, and whether the code that makes results (CODE_PATHS) differs from it."""
    def git(*args):
        out = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--", *CODE_PATHS)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def environment() -> dict:
    """Where a result came from: code version, package versions and hardware."""
    import tensorflow as tf

    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "git": git_state(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": versions,
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "gpus": [d.name for d in tf.config.list_physical_devices("GPU")],
    }
