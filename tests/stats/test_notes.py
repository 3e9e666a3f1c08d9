"""Notes carry their facts: tables read the kind and count, never the text."""

import pickle

import numpy as np
import pytest

import privfed
from mechanisms import LaplaceCountNoise
from privfed.notes import Note, repairs
from privfed.tradeoff import repair_facts


def test_a_note_is_its_text_and_its_fact():
    n = Note(
        "3 (client, class) pair(s) with count <= 0 were not sent (App. I.1 drop rule)", "dropped_pairs", 3
    )
    assert n == "3 (client, class) pair(s) with count <= 0 were not sent (App. I.1 drop rule)"
    assert (n.kind, n.count) == ("dropped_pairs", 3)
    back = pickle.loads(pickle.dumps(n))
    assert back == n and (back.kind, back.count) == ("dropped_pairs", 3)
    with pytest.raises(ValueError, match="note kind"):
        Note("x", "no-such-kind")
    # plain strings carry no fact, whatever their text says
    assert repairs(["3 (client, class) pair(s) dropped", "projected to the PSD cone"]) == (None, [])


def test_fedcof_drops_under_count_noise_are_counted_whatever_the_wording():
    """FedCOF's drop rule says "were dropped" in one path and "were not sent" in the secure one; the
    trade-off columns count both, because they read the note's fact."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 5, 300)
    F = rng.normal(size=(300, 4)) + y[:, None]
    k = rng.integers(0, 30, 300)
    head = privfed.fit(
        "fedcof",
        F,
        y,
        k,
        num_classes=5,
        num_clients=30,
        privacy=LaplaceCountNoise(epsilon=0.2),
        random_state=1,
    )
    dropped, _ = repair_facts([*head.notes, *head.privacy.notes])
    facts = [n for n in [*head.notes, *head.privacy.notes] if getattr(n, "kind", "")]
    assert facts and dropped == sum(n.count for n in facts) > 0
    # the secure protocol's wording ("were not sent") is counted the same way
    sent = Note(
        "4 (client, class) pair(s) with count <= 0 were not sent (App. I.1 drop rule)", "dropped_pairs", 4
    )
    assert repair_facts([sent, *facts]) == (dropped + 4, repair_facts(facts)[1])
