"""The public global text (Sent140's tweets, the paper's Twitter corpus) as a DeepType corpus and the
starts online training and personal data size personalize from (`starts`): same users and split as
the crowd's, the tweets' own vocabulary, a clear error when the data is missing, and a global model
trained once (model cache)."""

import dataclasses

import pytest

from ondevice.data import manifests, per_user_text, sent140
from ondevice.data.typing_samples import sentences
from ondevice.papers.deeptype import common, starts
from ondevice.papers.deeptype.experiments import deeptype_online
from ondevice.params import ParameterError

QUIET = lambda _: None  # noqa: E731


def test_sent140_corpus_shares_users_and_split_but_not_text_or_vocabulary(speeches):
    params = deeptype_online.Params.for_scale("smoke")
    crowd = per_user_text.load_corpus(params, speeches, QUIET)
    public = per_user_text.load_corpus(params, speeches, QUIET, global_text="sent140")
    assert public.split == crowd.split and public.users == crowd.users
    assert public.global_text == "sent140" and public.global_manifest.name == "sent140"
    assert [m.name for m in public.manifests] == [crowd.manifest.name, "sent140"]
    tweets = {w for m in sent140.messages() for s in sentences(m.text) for w in s}
    assert set(public.vocab.words[2:]) <= tweets and public.vocab != crowd.vocab  # built from the tweets alone
    assert not any(w.startswith("@") or "http" in w for s in public.crowd for w in s)  # mentions and links cleaned
    assert 0 < sum(map(len, public.crowd)) <= params.crowd_max_words + 100
    assert len(public.holdout_samples) >= params.global_holdout_words
    everything = per_user_text.load_corpus(dataclasses.replace(params, crowd_max_words=0), speeches, QUIET, "sent140")
    assert 80_000 < sum(map(len, everything.crowd)) < 115_000  # the mirror's LEAF test split: about 116K tokens


def test_missing_sent140_is_a_clear_error(speeches, tmp_path, monkeypatch):
    """Neither in the cache nor in the mirror (and no other source): the error names the file and what was tried."""
    monkeypatch.setenv("ONDEVICE_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ONDEVICE_DATA_MIRROR", str(tmp_path / "mirror"))
    (tmp_path / "mirror").mkdir()
    load = manifests.load
    monkeypatch.setattr(manifests, "load", lambda name: _mirror_only(load(name)) if name == "sent140" else load(name))
    params = deeptype_online.Params.for_scale("smoke")
    with pytest.raises(manifests.DataError, match=r"could not obtain all_data_niid.*json.*\n.*mirror"):
        per_user_text.load_corpus(params, speeches, QUIET, global_text="sent140")
    with pytest.raises(ParameterError, match="global text must be one of"):
        per_user_text.load_corpus(params, speeches, QUIET, global_text="twitter")


def _mirror_only(m: manifests.Manifest) -> manifests.Manifest:
    arts = tuple(
        dataclasses.replace(a, sources=tuple(s for s in a.sources if s["kind"] == "mirror")) for a in m.artifacts
    )
    return dataclasses.replace(m, artifacts=arts)


@pytest.mark.slow(reason="trains a global model on the tweets for one epoch (real TF), then finds it in the cache")
def test_the_public_global_model_trains_once(speeches, tmp_path, monkeypatch):
    monkeypatch.setenv("ONDEVICE_MODEL_CACHE", str(tmp_path / "models"))
    params = deeptype_online.Params.for_scale("smoke", crowd_max_words=2000, global_epochs=1)
    corpora = starts.load(params, speeches, QUIET)
    assert list(corpora) == ["sent140", "crowd"] and starts.main(corpora) is corpora["sent140"]
    models = starts.train(params, {"sent140": corpora["sent140"]}, QUIET)  # the crowd's is the shared model
    assert not any(models["sent140"].from_cache.values())
    trained = models["sent140"].history()
    assert len(trained) == 1 and trained.holdout_loss.notna().all()  # one epoch, scored on held-out tweets
    again = common.train_global(params, corpora["sent140"], QUIET)
    assert all(again.from_cache.values()) and again.entries[0].key == models["sent140"].entries[0].key
    assert again.model.get_layer("softmax").units == corpora["sent140"].vocab.size
    sizes = starts.sizes(corpora)
    assert sizes.global_text.tolist() == ["sent140", "crowd"] and sizes.main.tolist() == [True, False]
    assert (sizes.global_words > 1500).all() and sizes.test_users_oov_rate.between(0, 1).all()


def test_bad_starts_are_named():
    for bad in ((), ("sent140", "sent140"), ("twitter",)):
        with pytest.raises(ParameterError, match="global_texts"):
            deeptype_online.Params.for_scale("smoke", global_texts=bad)
    assert deeptype_online.Params.for_scale("smoke", global_texts=("crowd",)).global_texts == ("crowd",)
