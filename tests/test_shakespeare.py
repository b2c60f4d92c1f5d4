from collections import Counter

from ondevice.data.shakespeare import parse_play

UPPER = """THE PLAY

DRAMATIS PERSONAE

ALONSO, King of Naples

ACT 1
SCENE 1
[On a ship]

MASTER.
Boatswain!

BOATSWAIN.
Here, master: what cheer?
[Exit
MASTER]

Heigh, my hearts!

THESEUS
            Go, Philostrate,
Stir up the youth.
"""

ABBREV = """PERSONS REPRESENTED.

Ham., Prince

ACT I.

Scene I. Elsinore.

Ber.
Who's there?

P. Queen.
Nay, answer me.
"""


def test_upper_case_speakers_stage_directions_and_persona_list_are_handled():
    speeches = parse_play(UPPER, "toy")
    assert [(s.role, s.text.split()) for s in speeches] == [
        ("MASTER", ["Boatswain!"]),
        ("BOATSWAIN", ["Here,", "master:", "what", "cheer?", "Heigh,", "my", "hearts!"]),
        ("THESEUS", ["Go,", "Philostrate,", "Stir", "up", "the", "youth."]),
    ]


def test_abbreviated_speakers_and_scene_headings():
    speeches = parse_play(ABBREV, "toy")
    assert [(s.role, s.text) for s in speeches] == [("Ber", "Who's there?"), ("P. Queen", "Nay, answer me.")]


def test_poems_without_acts_have_no_speeches():
    assert parse_play("SONNETS\n\nFrom fairest creatures we desire increase,\n", "sonnets") == []


def test_real_corpus_has_leaf_like_users(speeches):
    words = Counter()
    for s in speeches:
        words[(s.play, s.role)] += len(s.text.split())
    assert len({p for p, _ in words}) == 37  # the plays; poems and sonnets have no roles
    assert 1000 < len(words) < 1600  # LEAF reports 1,129 users
    assert words.most_common(1)[0][0] == ("hamlet", "Ham")
    assert sum(1 for n in words.values() if n >= 3000) >= 30


def test_roles_go_through_the_per_user_text_type(speeches):
    from ondevice.data import shakespeare, user_text

    messages = shakespeare.messages(speeches)
    assert len(messages) == len(speeches) and messages[0].user == f"{speeches[0].play}/{speeches[0].role}"
    users = shakespeare.users(speeches)
    assert users == user_text.user_sentences(messages)
    assert sum(len(s) for s in users["hamlet/Ham"]) > 11000


def test_default_split_holds_the_twenty_heaviest_roles(speeches):
    from ondevice.data import shakespeare
    from ondevice.data.splits import make_split

    users = shakespeare.users(speeches)
    sizes = {u: sum(map(len, s)) for u, s in users.items()}
    split = make_split("shakespeare", sizes, shakespeare.SPLITS["default"])
    assert len(split.test) == 20 and set(split.test) == set(sorted(sizes, key=sizes.get)[-20:])
    assert {"hamlet/Ham", "othello/IAGO", "henry_v/KING HENRY"} <= set(split.test)
