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
        "name": "toy", "description": "a toy set", "license": "CC0", "citation": "nobody",
        "scales": ["smoke"], "layout": {"texts": "toy.tar.gz.d/toy"},
        "artifacts": [{"file": "toy.tar.gz", "sha256": sha or hashlib.sha256(data).hexdigest(), "size": len(data),
                       "extract": "tar.gz", "sources": [{"kind": "mirror", "path": "toy/toy.tar.gz"}]}],
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


def test_corrupt_cache_entry_is_an_error_not_a_silent_refetch(tmp_path, dirs):
    cache, mirror = dirs
    data = make_tar(mirror / "toy" / "toy.tar.gz", {"toy/a.txt": b"hello"})
    m = manifests.load(write_manifest(tmp_path, data))
    manifests.fetch(m)
    (cache / "toy" / "toy.tar.gz").write_bytes(data[:-1] + b"x")
    with pytest.raises(DataError, match="expected"):
        manifests.fetch(m)


def test_missing_everywhere_lists_what_was_tried(tmp_path, dirs):
    m = manifests.load(write_manifest(tmp_path, b"not there"))
    with pytest.raises(DataError, match="could not obtain toy.tar.gz.*\n.*mirror: not in mirror"):
        manifests.fetch(m)


@pytest.mark.parametrize("members,symlink", [({"../evil.txt": b"x"}, None), ({"/abs.txt": b"x"}, None),
                                             ({"toy/a.txt": b"x"}, "/etc/passwd")])
def test_unsafe_archives_are_rejected(tmp_path, dirs, members, symlink):
    cache, mirror = dirs
    data = make_tar(mirror / "toy" / "toy.tar.gz", members, symlink)
    m = manifests.load(write_manifest(tmp_path, data))
    with pytest.raises(DataError, match="archive"):
        manifests.fetch(m)
    assert not (tmp_path / "evil.txt").exists()
    assert not (cache / "toy" / "toy.tar.gz.d").exists()


@pytest.mark.parametrize("change,message", [
    ({"artifacts": []}, "non-empty"),
    ({"license": None}, None),
    ({"artifacts": [{"file": "x", "sha256": "abc", "size": 1, "sources": [{"kind": "mirror", "path": "x"}]}]}, "sha256"),
    ({"artifacts": [{"file": "x", "sha256": "a" * 64, "size": 1, "sources": [{"kind": "ftp"}]}]}, "kind"),
])
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
