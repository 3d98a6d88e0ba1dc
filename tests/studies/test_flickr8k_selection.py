"""studies/flickr8k/selection.py: choosing the best of several models on one half of the photos and
scoring it on the other takes the choice's luck out of its lead; the paired interval covers the
true difference."""

from __future__ import annotations

import numpy as np
import pytest

from studies.flickr8k.selection import chosen_on_one_half, paired_interval


def _centred(scores: np.ndarray) -> np.ndarray:
    return scores - scores.mean()


def test_among_equals_the_luck_of_one_half_is_the_other_halfs_loss() -> None:
    """Five models with the same mean over all the photos: whichever leads on the half it is chosen
    on trails by as much on the other (the halves' means average to the whole's)."""
    rng = np.random.default_rng(1)
    base = rng.normal(0.6, 0.4, size=1000)
    scores = {f"model {i}": base + _centred(rng.normal(0, 0.1, size=1000)) for i in range(5)}
    found = chosen_on_one_half(scores, before="model 0", halvings=300)
    assert found["lead_on_the_half_chosen_on"] > 0.003  # the winner's luck
    assert found["lead_on_the_other_half"] == pytest.approx(-found["lead_on_the_half_chosen_on"], rel=1e-9)
    assert sum(found["chosen"].values()) == pytest.approx(1.0)


def test_a_real_lead_is_chosen_every_time_and_the_halves_average_to_it() -> None:
    rng = np.random.default_rng(2)
    base = rng.normal(0.6, 0.4, size=1000)
    scores = {"other": base - 0.02 + _centred(rng.normal(0, 0.1, size=1000)),
              "before": base + _centred(rng.normal(0, 0.1, size=1000)),
              "better": base + 0.05 + _centred(rng.normal(0, 0.1, size=1000))}
    found = chosen_on_one_half(scores, before="before", halvings=300)
    assert found["chosen"]["better"] == 1.0 and found["other_half_lead_above_zero"] == 1.0
    # its lead over all the photos is 0.05: what one half shows above it, the other shows below
    assert found["lead_on_the_half_chosen_on"] + found["lead_on_the_other_half"] == pytest.approx(0.1, rel=1e-9)


def test_the_paired_interval_covers_the_difference_and_not_zero_when_it_is_clear() -> None:
    rng = np.random.default_rng(3)
    before = rng.normal(0.6, 0.4, size=1000)
    after = before + 0.03 + rng.normal(0, 0.05, size=1000)  # the photos' own spread cancels: paired
    found = paired_interval(after, before, resamples=2000)
    assert found["low"] < 0.03 < found["high"] and found["low"] > 0
    assert found["mean"] == pytest.approx(float((after - before).mean()))
