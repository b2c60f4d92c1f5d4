"""WordNet 3.0 (data_manifests/wordnet.yaml), read straight from its database files: the synonym
dictionary of EDA (AutLearn A3). No NLTK: the suite needs only "which lemmas share a synset with
this word", which the `index.<pos>` and `data.<pos>` files answer directly (format: wndb(5WN)).

- `index.<pos>`: one line per lemma, `lemma pos synset_cnt p_cnt [ptr_symbol...] sense_cnt
  tagsense_cnt synset_offset...`; the offsets are byte offsets into `data.<pos>`.
- `data.<pos>`: one line per synset, `offset lex_filenum ss_type w_cnt (word lex_id){w_cnt} ...`,
  w_cnt in hexadecimal; adjectives may carry a syntactic marker, `word(a)`, `(p)` or `(ip)`.
- `<pos>.exc`: irregular inflections, `inflected base...` (e.g. `went go`).
Lines starting with a space are the license header. Inflected words find their lemma as WordNet's
morphy(7WN) does, simplified: the exception list, or one detachment rule (e.g. -ies -> -y), kept
only when the result is in the index.
"""

from __future__ import annotations

import functools
from pathlib import Path

from . import manifests

POS = ("noun", "verb", "adj", "adv")
# morphy(7WN)'s detachment rules per part of speech: (suffix, replacement).
DETACH = {
    "noun": (
        ("s", ""),
        ("ses", "s"),
        ("xes", "x"),
        ("zes", "z"),
        ("ches", "ch"),
        ("shes", "sh"),
        ("men", "man"),
        ("ies", "y"),
    ),
    "verb": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "adj": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "adv": (),
}
ADJ_MARKERS = ("(a)", "(p)", "(ip)")


class WordNet:
    """The database in one directory (Debian's /usr/share/wordnet layout, or a fixture of it)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.index: dict[str, dict[str, tuple[int, ...]]] = {}
        self.data: dict[str, bytes] = {}
        self.exceptions: dict[str, dict[str, tuple[str, ...]]] = {}
        for pos in POS:
            self.index[pos] = self._read_index(self._file(f"index.{pos}"))
            self.data[pos] = self._file(f"data.{pos}").read_bytes()
            exc = self.root / f"{pos}.exc"  # optional: fixtures may leave it out
            self.exceptions[pos] = self._read_exceptions(exc) if exc.is_file() else {}

    def _file(self, name: str) -> Path:
        path = self.root / name
        if not path.is_file():
            raise FileNotFoundError(
                f"WordNet file {path} is missing (expected the wndb layout: index.<pos>, data.<pos>)"
            )
        return path

    @staticmethod
    def _read_index(path: Path) -> dict[str, tuple[int, ...]]:
        out = {}
        for number, line in enumerate(path.read_text(encoding="latin-1").splitlines(), 1):
            if not line or line[0] == " ":
                continue
            f = line.split()
            try:
                n_synsets, n_pointers = int(f[2]), int(f[3])
                offsets = tuple(int(o) for o in f[6 + n_pointers : 6 + n_pointers + n_synsets])
            except (IndexError, ValueError) as exc:
                raise ValueError(f"{path}:{number}: not a WordNet index line: {line[:80]!r}") from exc
            if len(offsets) != n_synsets:
                raise ValueError(f"{path}:{number}: {n_synsets} synsets announced, {len(offsets)} listed")
            out[f[0]] = offsets
        return out

    @staticmethod
    def _read_exceptions(path: Path) -> dict[str, tuple[str, ...]]:
        out = {}
        for line in path.read_text(encoding="latin-1").splitlines():
            f = line.split()
            if len(f) >= 2:
                out[f[0]] = tuple(f[1:])
        return out

    def synset_lemmas(self, pos: str, offset: int) -> tuple[str, ...]:
        """The lemmas of the synset at `offset` in data.<pos>, markers removed (`_` joins words)."""
        data = self.data[pos]
        line = data[offset : data.find(b"\n", offset)].decode("latin-1").split()
        if not line or line[0] != f"{offset:08d}":
            raise ValueError(f"{self.root / f'data.{pos}'}: no synset at byte offset {offset}")
        count = int(line[3], 16)
        words = line[4 : 4 + 2 * count : 2]
        for marker in ADJ_MARKERS:
            words = [w[: -len(marker)] if w.endswith(marker) else w for w in words]
        return tuple(words)

    def lemmas(self, word: str, pos: str) -> list[str]:
        """The index lemmas `word` may be an inflection of (itself included), per simplified morphy."""
        index = self.index[pos]
        if word in self.exceptions[pos]:
            candidates = (word, *self.exceptions[pos][word])
        else:
            candidates = (
                word,
                *(word[: -len(s)] + r for s, r in DETACH[pos] if word.endswith(s) and len(word) > len(s)),
            )
        return list(dict.fromkeys(c for c in candidates if c in index))

    @functools.lru_cache(maxsize=None)  # noqa: B019 (one WordNet per process, kept for its lifetime)
    def synonyms(self, word: str) -> tuple[str, ...]:
        """Every lemma sharing a synset with `word` in any part of speech, lower-cased, with `_`
        and `-` as spaces (a synonym may be several words), sorted, the word itself left out."""
        word = word.lower().replace(" ", "_")
        found = set()
        for pos in POS:
            for lemma in self.lemmas(word, pos):
                for offset in self.index[pos][lemma]:
                    found.update(w.replace("_", " ").replace("-", " ").lower() for w in self.synset_lemmas(pos, offset))
        found.discard(word.replace("_", " "))
        return tuple(sorted(found))


def load() -> tuple[WordNet, manifests.Manifest]:
    """WordNet 3.0 from the manifest's Debian package (fetched and verified once into the data
    cache), and the manifest for run.json."""
    manifest = manifests.load("wordnet")
    return WordNet(manifests.resolve(manifest, "dict")), manifest
