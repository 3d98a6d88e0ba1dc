"""studies/flickr8k/stage_times.py: each recipe's stages are commands a user types, in order, so every
checkpoint a stage reads is written by a stage before it; and the table shows the stages in the
recipe's order, however the kept times were taken."""

from __future__ import annotations

import re

import pytest

from studies.flickr8k import stage_times


@pytest.mark.parametrize("recipe", ["soft", "best"])
def test_every_checkpoint_a_stage_reads_is_written_by_an_earlier_stage(recipe) -> None:
    stages = stage_times._stages(data="DATA", cache="CACHE", out="OUT", recipe=recipe)
    written: set[str] = set()
    for name, command in stages.items():
        line = " ".join(command)
        read = set(re.findall(r"(?:--checkpoint |train\.init_from=)OUT(\S*)/best\.pt", line))
        assert read <= written, f"{name} reads {sorted(read - written)} before any stage trains it"
        written |= set(re.findall(r"train\.out_dir=OUT(\S*)", line))
    assert "evaluate_trio" in stages or recipe == "soft"


def test_the_best_recipe_trains_each_seed_its_trio_reads() -> None:
    stages = stage_times._stages(data="DATA", cache="CACHE", out="OUT", recipe="best")
    trio = re.findall(r"--checkpoint OUT/(\w+)/best\.pt", " ".join(stages["evaluate_trio"]))
    assert len(trio) == 3 and len(set(trio)) == 3
    assert trio[0] == "seed3" and "train_seed3" in stages  # the shipped file's first decoder


def test_the_table_lists_the_stages_in_the_recipe_order_however_they_were_timed() -> None:
    order = list(stage_times._stages(data="DATA", cache="CACHE", out="OUT", recipe="best"))
    # seed 3 joined the recipe after the rest was timed: its stage and the trio's were timed last
    timed = [name for name in order if name not in ("train_seed3", "evaluate_trio")] + ["train_seed3",
                                                                                        "evaluate_trio"]
    assert sorted(timed) == sorted(order) and timed != order
    kept = {"stages": {name: {"command": name, "seconds": 60.0 * (i + 1), "cpu": "a CPU", "load_before": 0.0,
                              "load_after": 0.0} for i, name in enumerate(timed)}}
    rows = [line for line in stage_times.table(kept).splitlines() if line.startswith("| ") and "`" in line]
    assert [re.search(r"`(\w+)`", row).group(1) for row in rows] == order
    assert f"| in all | | {sum(range(1, len(order) + 1)):.1f} | |" in stage_times.table(kept)
