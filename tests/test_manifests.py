import hashlib
import io
import tarfile
from pathlib import Path

import pytest
import yaml

from ondevice.data import manifests
from ondevice.data.manifests import DataError


def make_tar(path: Path, members: dict[str, bytes], symlink: str | None = None) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if symlink:
            info = tarfile.TarInfo("link")
            info.type, info.linkname = tarfile.SYMTYPE, symlink
            tar.addfile(info)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def write_manifest(tmp_path: Path, data: bytes, sha: str | None = None, **extra) -> Path:
    doc = {
        "name": "toy",
        "description": "a toy set",
        "license": "CC0",
        "citation": "nobody",
        "scales": ["smoke"],
        "layout": {"texts": "toy.tar.gz.d/toy"},
        "artifacts": [
            {
                "file": "toy.tar.gz",
                "sha256": sha or hashlib.sha256(data).hexdigest(),
                "size": len(data),
                "extract": "tar.gz",
                "sources": [{"kind": "mirror", "path": "toy/toy.tar.gz"}],
            }
        ],
        **extra,
    }
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    cache, mirror = tmp_path / "cache", tmp_path / "mirror"
    (mirror / "toy").mkdir(parents=True)
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(cache))
    monkeypatch.setenv("ONDEVICE_DATA_MIRROR", str(mirror))
    return cache, mirror


def test_fetch_from_mirror_verifies_and_extracts(tmp_path, dirs):
    cache, mirror = dirs
    data = make_tar(mirror / "toy" / "toy.tar.gz", {"toy/a.txt": b"hello"})
    m = manifests.load(write_manifest(tmp_path, data))
    texts = manifests.resolve(m, "texts")
    assert (texts / "a.txt").read_bytes() == b"hello"
    assert (cache / "toy" / "toy.tar.gz").read_bytes() == data
    # a second resolve uses the cache even when the mirror is gone
    (mirror / "toy" / "toy.tar.gz").unlink()
    assert manifests.resolve(m, "texts") == texts


def test_checksum_mismatch_names_manifest_artifact_and_path_and_leaves_nothing(tmp_path, dirs):
    cache, mirror = dirs
    data = make_tar(mirror / "toy" / "toy.tar.gz", {"toy/a.txt": b"hello"})
    m = manifests.load(write_manifest(tmp_path, data, sha="0" * 64))
    with pytest.raises(DataError) as err:
        manifests.fetch(m)
    text = str(err.value)
    assert "toy.yaml" in text and "toy.tar.gz" in text and str(cache / "toy" / "toy.tar.gz") in text
    assert "sha256" in text
    assert not any(p.is_file() for p in (cache / "toy").rglob("*"))


def test_corrupt_cache_entry_is_an_error_that_says_how_to_recover_and_refetch_repairs_it(tmp_path, dirs):
    cache, mirror = dirs
    data = make_tar(mirror / "toy" / "toy.tar.gz", {"toy/a.txt": b"hello"})
    m = manifests.load(write_manifest(tmp_path, data))
    manifests.fetch(m)
    cached = cache / "toy" / "toy.tar.gz"
    cached.write_bytes(data[:-1] + b"x")
    stale = cache / "toy" / "toy.tar.gz.d" / "toy" / "stale.txt"
    stale.write_text("left from an old extraction")
    with pytest.raises(DataError, match="expected") as err:
        manifests.fetch(m)
    assert f"delete {cached}" in str(err.value) and "make data REFETCH=1" in str(err.value)
    assert cached.read_bytes() != data  # not silently repaired
    root = manifests.fetch(m, refetch=True)
    assert cached.read_bytes() == data and not stale.exists()
    assert (root / "toy.tar.gz.d" / "toy" / "a.txt").read_bytes() == b"hello"


def test_command_line_refetch_repairs_a_corrupt_cache(tmp_path, dirs, monkeypatch, capsys):
    from ondevice.data import __main__ as cli

    cache, mirror = dirs
    data = make_tar(mirror / "toy" / "toy.tar.gz", {"toy/a.txt": b"hello"})
    m = manifests.load(write_manifest(tmp_path, data))
    monkeypatch.setattr(manifests, "all_manifests", lambda: [m])
    assert cli.main(["--scale", "smoke"]) == 0
    (cache / "toy" / "toy.tar.gz").write_bytes(b"x" * len(data))
    assert cli.main(["--scale", "smoke"]) == 1
    assert "REFETCH=1" in capsys.readouterr().err
    assert cli.main(["--scale", "smoke", "--refetch"]) == 0
    assert (cache / "toy" / "toy.tar.gz").read_bytes() == data


def test_missing_everywhere_lists_what_was_tried(tmp_path, dirs):
    m = manifests.load(write_manifest(tmp_path, b"not there"))
    with pytest.raises(DataError, match="could not obtain toy.tar.gz.*\n.*mirror: not in mirror"):
        manifests.fetch(m)


@pytest.mark.parametrize(
    "name,symlink",
    [
        ("../evil.txt", None),
        ("../../../evil.txt", None),
        ("{tmp_path}/outside/abs.txt", None),
        ("toy/a.txt", "/etc/passwd"),
    ],
)
def test_unsafe_archives_are_rejected_and_nothing_lands_anywhere(tmp_path, dirs, name, symlink):
    # Extraction happens in a temporary dir under cache/toy/, so "../evil.txt" would land in
    # cache/toy/ and "../../../evil.txt" in tmp_path; the absolute member points into tmp_path
    # too, so that every place an unsafe member could land is searched below.
    cache, mirror = dirs
    name = name.format(tmp_path=tmp_path)
    data = make_tar(mirror / "toy" / "toy.tar.gz", {name: b"x"}, symlink)
    m = manifests.load(write_manifest(tmp_path, data))
    with pytest.raises(DataError, match="archive"):
        manifests.fetch(m)
    landed = [p for p in tmp_path.rglob("*") if p.name in ("evil.txt", "abs.txt", "link")]
    assert not landed
    assert not (cache / "toy" / "evil.txt").exists() and not (cache / "evil.txt").exists()
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "outside").exists()
    assert not (cache / "toy" / "toy.tar.gz.d").exists()
    assert not [p for p in (cache / "toy").iterdir() if p.name.startswith(".")]  # no temporary dirs left


@pytest.mark.parametrize(
    "change,message",
    [
        ({"artifacts": []}, "non-empty"),
        ({"license": None}, None),
        (
            {"artifacts": [{"file": "x", "sha256": "abc", "size": 1, "sources": [{"kind": "mirror", "path": "x"}]}]},
            "sha256",
        ),
        ({"artifacts": [{"file": "x", "sha256": "a" * 64, "size": 1, "sources": [{"kind": "ftp"}]}]}, "kind"),
    ],
)
def test_malformed_manifests_are_clear_errors(tmp_path, change, message):
    path = write_manifest(tmp_path, b"x")
    doc = yaml.safe_load(path.read_text())
    doc.update(change)
    if change.get("license", 1) is None:
        del doc["license"]
        message = "missing field 'license'"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(DataError, match=message) as err:
        manifests.load(path)
    assert str(path) in str(err.value)


def test_not_yaml_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(DataError, match="not valid YAML"):
        manifests.load(path)


def test_repository_manifests_are_valid_and_declare_stand_in_use():
    found = {m.name: m for m in manifests.all_manifests()}
    assert "shakespeare" in found
    assert found["shakespeare"].stand_in_for
    for m in found.values():
        assert m.path.stem == m.name
