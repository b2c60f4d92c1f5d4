"""ondevice: notebook-first reproductions of on-device personalization papers.

tensorflow-model-optimization 0.8 only works with tf_keras, and importing it switches the
whole process to legacy Keras; we choose that Keras up front so every module sees one Keras.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from pathlib import Path

__version__ = "0.1.0"

REPO_ROOT = Path(__file__).resolve().parents[2]
