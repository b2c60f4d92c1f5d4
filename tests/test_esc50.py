"""ESC-50 loader (official layout, 44.1 kHz -> 16 kHz, clear errors) and the ESC-50 -> AudioSet mapping."""

import shutil
import wave

import numpy as np
import pandas as pd
import pytest

from ondevice.data import esc50, manifests
from ondevice.models import yamnet


@pytest.fixture(scope="module")
def clips():
    try:
        return esc50.load_declared()
    except manifests.DataError as exc:
        pytest.skip(f"ESC-50 unavailable: {exc}")


@pytest.fixture(scope="module")
def class_names():
    try:
        return yamnet.class_names(manifests.resolve("yamnet", "class_map"))
    except manifests.DataError as exc:
        pytest.skip(f"YAMNet class map unavailable: {exc}")


ESC50_CLASSES = [
    "dog",
    "rooster",
    "pig",
    "cow",
    "frog",
    "cat",
    "hen",
    "insects",
    "sheep",
    "crow",
    "rain",
    "sea_waves",
    "crackling_fire",
    "crickets",
    "chirping_birds",
    "water_drops",
    "wind",
    "pouring_water",
    "toilet_flush",
    "thunderstorm",
    "crying_baby",
    "sneezing",
    "clapping",
    "breathing",
    "coughing",
    "footsteps",
    "laughing",
    "brushing_teeth",
    "snoring",
    "drinking_sipping",
    "door_wood_knock",
    "mouse_click",
    "keyboard_typing",
    "door_wood_creaks",
    "can_opening",
    "washing_machine",
    "vacuum_cleaner",
    "clock_alarm",
    "clock_tick",
    "glass_breaking",
    "helicopter",
    "chainsaw",
    "siren",
    "car_horn",
    "engine",
    "train",
    "church_bells",
    "airplane",
    "fireworks",
    "hand_saw",
]


def test_mapping_covers_every_class_with_existing_audioset_classes(class_names):
    table = pd.read_csv(esc50.MAPPING)
    assert list(table.target) == list(range(50)) and list(table.category) == ESC50_CLASSES
    mapping = esc50.read_mapping()
    assert all(mapping[t] for t in range(50))
    unknown = {n for names in mapping.values() for n in names} - set(class_names)
    assert not unknown
    # Table 5.1's examples
    assert {"Dog", "Bark", "Animal"} <= set(mapping[0]) and {"Typing", "Computer keyboard"} <= set(mapping[32])


def test_mapping_agrees_with_the_release_metadata(clips):
    table = pd.read_csv(esc50.MAPPING).set_index("target").category
    pairs = clips.meta[["target", "category"]].drop_duplicates()
    assert all(table[t] == c for t, c in zip(pairs.target, pairs.category))


def test_audioset_labels_are_multi_hot(class_names):
    labels = esc50.audioset_labels([0, 32], esc50.read_mapping(), class_names)
    assert labels.shape == (2, 521)
    assert {class_names[i] for i in np.flatnonzero(labels[0])} == set(esc50.read_mapping()[0])
    with pytest.raises(ValueError, match="not AudioSet"):
        esc50.audioset_labels([0], {0: ["No such sound"]}, class_names)


def test_declared_subset_loads_at_16_khz(clips):
    assert len(clips.meta) == 414 and (clips.meta.fold == 4).sum() == 400
    assert clips.meta.groupby("target").size().min() >= 8
    x = clips.waveform(0)
    assert (
        x.dtype == np.float32 and len(x) == 5 * 16000 and 0.01 < np.abs(x).max() < 1.1
    )  # resampling may overshoot a full-scale clip slightly


def _mini_release(root, clips, n=3):
    (root / "meta").mkdir(parents=True)
    (root / "audio").mkdir()
    meta = clips.meta.head(n)
    meta.to_csv(root / "meta" / "esc50.csv", index=False)
    for p in clips.paths[:n]:
        shutil.copy(p, root / "audio" / p.name)
    return meta


def test_official_layout_and_its_errors(tmp_path, clips):
    meta = _mini_release(tmp_path / "ESC-50-master", clips)
    got = esc50.load_root(tmp_path / "ESC-50-master")
    assert list(got.meta.filename) == list(meta.filename)
    np.testing.assert_array_equal(got.waveform(1), clips.waveform(1))
    with pytest.raises(esc50.Esc50Error, match="meta/esc50.csv"):
        esc50.load_root(tmp_path / "nothing")
    # a listed clip that is missing
    (tmp_path / "ESC-50-master" / "audio" / meta.filename.iloc[2]).unlink()
    with pytest.raises(esc50.Esc50Error, match=meta.filename.iloc[2]):
        esc50.load_root(tmp_path / "ESC-50-master")
    # the declared digest catches a changed file
    with pytest.raises(esc50.Esc50Error, match="differs"):
        esc50.load(
            tmp_path / "ESC-50-master" / "meta" / "esc50.csv", clips.paths[0].parent, "x", expected_digest="0" * 64
        )


def test_malformed_files_give_clear_errors(tmp_path, clips):
    bad_csv = tmp_path / "esc50.csv"
    bad_csv.write_text("filename,target\nx.wav,1\n")
    with pytest.raises(esc50.Esc50Error, match="missing column"):
        esc50.read_meta(bad_csv)
    bad_csv.write_text("filename,fold,target,category\nx.wav,1,77,dog\n")
    with pytest.raises(esc50.Esc50Error, match="target 77"):
        esc50.read_meta(bad_csv)
    truncated = tmp_path / "truncated.wav"
    truncated.write_bytes(clips.paths[0].read_bytes()[:5000])
    with pytest.raises(esc50.Esc50Error, match="truncated.wav"):
        esc50.read_wav(truncated)
    eight_bit = tmp_path / "eight.wav"
    with wave.open(str(eight_bit), "wb") as w:
        w.setnchannels(1), w.setsampwidth(1), w.setframerate(44100), w.writeframes(bytes(100))
    with pytest.raises(esc50.Esc50Error, match="8-bit"):
        esc50.read_wav(eight_bit)
    not_wav = tmp_path / "text.wav"
    not_wav.write_text("hello")
    with pytest.raises(esc50.Esc50Error, match="not a readable"):
        esc50.read_wav(not_wav)


def test_missing_mirror_is_a_data_error(monkeypatch, tmp_path):
    monkeypatch.delenv("ONDEVICE_DATA_MIRROR", raising=False)
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path))
    with pytest.raises(manifests.DataError):
        esc50.load_declared()
