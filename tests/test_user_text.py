"""The per-user text format: what it accepts, what it rejects (with file and line), and the
meaning of out-of-order and duplicate timestamps; a DeepType corpus read from such a file."""

import json

import numpy as np
import pytest

from ondevice.data import per_user_text, user_text
from ondevice.data.manifests import DataError
from ondevice.params import ParameterError


def write_lines(path, lines):
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def test_histories_are_stably_sorted_by_timestamp_and_keep_every_user(tmp_path):
    path = write_lines(
        tmp_path / "logs.jsonl",
        [
            {"user": "bob", "timestamp": 20, "text": "later words"},
            {"user": "ann", "timestamp": "2024-05-01T12:00:00Z", "text": "second. third"},
            {"user": "bob", "timestamp": 10, "text": "early"},
            "",
            {"user": "bob", "timestamp": 20, "text": "later words"},  # a duplicate counts again
            {"user": "ann", "timestamp": "2024-05-01T11:00:00", "text": "first", "app": "mail"},
            {"user": "bob", "timestamp": 20, "text": "same time"},
            {"user": "cid", "timestamp": 1, "text": "!!! 123"},  # no words: kept, with an empty history
        ],
    )
    messages = user_text.read(path)
    assert len(messages) == 7
    users = user_text.user_sentences(messages)
    assert users == {
        "bob": [["early"], ["later", "words"], ["later", "words"], ["same", "time"]],
        "ann": [["first"], ["second"], ["third"]],
        "cid": [],
    }


@pytest.mark.parametrize(
    "line, message",
    [
        ("{not json", "not valid JSON"),
        ('["user", 1, "text"]', "expected a JSON object"),
        ('{"user": "a", "text": "hi"}', "missing key(s) ['timestamp']"),
        ('{"user": "", "timestamp": 1, "text": "hi"}', "'user' must be a non-empty string"),
        ('{"user": 7, "timestamp": 1, "text": "hi"}', "'user' must be a non-empty string"),
        ('{"user": "a", "timestamp": 1, "text": null}', "'text' must be a string"),
        ('{"user": "a", "timestamp": "yesterday", "text": "hi"}', "bad 'timestamp'"),
        ('{"user": "a", "timestamp": true, "text": "hi"}', "bad 'timestamp'"),
        ('{"user": "a", "timestamp": NaN, "text": "hi"}', "bad 'timestamp'"),
    ],
)
def test_malformed_lines_are_rejected_with_file_and_line(tmp_path, line, message):
    path = write_lines(tmp_path / "bad.jsonl", [{"user": "a", "timestamp": 0, "text": "fine"}, "", line])
    with pytest.raises(DataError) as err:
        user_text.read(path)
    assert f"{path}:3:" in str(err.value) and message in str(err.value)


def test_missing_or_empty_files_are_errors(tmp_path):
    with pytest.raises(DataError, match="no per-user text file"):
        user_text.read(tmp_path / "absent.jsonl")
    with pytest.raises(DataError, match="no messages"):
        user_text.read(write_lines(tmp_path / "empty.jsonl", ["", "  "]))


def test_round_trip(tmp_path):
    messages = [user_text.Message("u", 1.5, "hello there"), user_text.Message("v", 0.0, "")]
    user_text.write(messages, tmp_path / "m.jsonl")
    assert user_text.read(tmp_path / "m.jsonl") == messages


def test_a_deeptype_corpus_from_a_user_file(speeches, tmp_path):
    """Shakespeare written out in the generic format and read back through `corpus` gives the same
    users, split and crowd as the built-in loader; a corpus path that is no file is a ParameterError."""
    from ondevice.data import shakespeare

    path = tmp_path / "shakespeare.jsonl"  # the split draws from a stream named after the data set
    user_text.write(shakespeare.messages(speeches), path)
    quiet = lambda _: None
    built_in = per_user_text.load_corpus(_params(), speeches, quiet)
    from_file = per_user_text.load_corpus(_params(corpus=str(path)), log=quiet)
    assert from_file.users == built_in.users
    assert from_file.split.test == built_in.split.test and from_file.split.crowd == built_in.split.crowd
    assert from_file.crowd_samples.digest() == built_in.crowd_samples.digest()
    assert (
        from_file.manifest.stand_in_for is None
        and from_file.manifest.artifacts[0].sha256 != built_in.manifest.artifacts[0].sha256
    )
    with pytest.raises(ParameterError, match="corpus"):
        _params(corpus=str(tmp_path / "absent.jsonl"))


@pytest.mark.parametrize("n_users, test, validation", [(4, 2, 1), (5, 2, 1), (12, 4, 2), (40, 16, 6)])
def test_a_small_user_file_gets_a_split_scaled_to_its_users(tmp_path, n_users, test, validation):
    """Fewer users than the preset asks for: 40% test (at least 2, from the heavier half), 20%
    validation (at least 1), the rest crowd; every user in exactly one role."""
    rng = np.random.default_rng(n_users)
    words = [f"w{i}" for i in range(50)]
    lines = [
        user_text.Message(f"user{u:02d}", float(t), " ".join(rng.choice(words, 8)) + ".")
        for u in range(n_users)
        for t in range(20 + 10 * u)
    ]
    path = tmp_path / "own.jsonl"
    user_text.write(lines, path)
    from ondevice.papers.deeptype.experiments.deeptype_top3eff import Params

    corpus = per_user_text.load_corpus(Params.for_scale("default", corpus=str(path)), log=lambda _: None)
    split = corpus.split  # the default preset asks for 20 test users with 4,650 words, 6 validation users
    assert (len(split.test), len(split.validation)) == (test, validation)
    assert len(split.crowd) == n_users - test - validation
    sizes = {u: sum(map(len, s)) for u, s in corpus.users.items()}
    assert min(sizes[u] for u in split.test) >= np.median(list(sizes.values()))  # the heavier half


def test_a_user_file_with_too_few_users_is_a_clear_error(tmp_path):
    path = tmp_path / "three.jsonl"
    user_text.write([user_text.Message(f"u{i}", 0.0, "a few words here.") for i in range(3)], path)
    with pytest.raises(ParameterError, match="3 users; a split needs at least 4"):
        per_user_text.load_corpus(_params(corpus=str(path)), log=lambda _: None)


def _params(**overrides):
    from ondevice.papers.deeptype.experiments.deeptype_top3eff import Params

    return Params.for_scale("smoke", **overrides)
