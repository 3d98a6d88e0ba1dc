"""The host-sync counter of tests/syncs.py, on snippets whose syncs are known."""

from __future__ import annotations

import numpy as np
import torch

from tests.syncs import counting_syncs


def test_it_counts_each_call_that_reads_a_value_on_the_host_by_kind():
    values = torch.tensor([1.0, 2.0, 3.0])
    mask = values > 1
    with counting_syncs() as syncs:
        values[0].item()
        values.tolist()
        if values.any():  # bool() of a tensor: the `if` needs the value
            pass
        float(values[1])
        int(values[2])
        list(range(5))[torch.tensor(2)]  # __index__
        values.cpu()
        values.to("cpu")
        values.numpy()
        np.asarray(values)  # __array__
        f"{values[0]:.1f}"  # __format__
        torch.nonzero(values)
        values[mask]  # the result's size is the count of True
        values.clone()[mask] = 0.0
        torch.masked_select(values, mask)
        torch.where(mask)  # the one-argument form is nonzero
        torch.repeat_interleave(values, torch.tensor([1, 2, 3]))  # the size is the repeats' sum
        torch.unique(values)
    assert dict(syncs.counts) == {
        "item": 1, "tolist": 1, "__bool__": 1, "__float__": 1, "__int__": 1, "__index__": 1, "cpu": 1, "to(cpu)": 1,
        "numpy": 1, "__array__": 1, "__format__": 1, "nonzero": 1, "__getitem__[mask]": 1, "__setitem__[mask]": 1,
        "masked_select": 1, "where(condition)": 1, "repeat_interleave(tensor)": 1, "unique": 1,
    }
    assert syncs.total == 18
    assert syncs.sites["item", "test_syncs.py:15"] == 1  # the line that asked, for the messages of tests


def test_work_that_stays_on_the_device_is_not_counted():
    values = torch.tensor([1.0, 2.0, 3.0])
    mask = values > 1
    with counting_syncs() as syncs:
        found = values.any()  # a tensor, not yet read
        torch.where(mask, values, -values)
        values[torch.tensor([0, 2])]  # an integer index: the size is known
        values[1:]
        values.to(values.device)  # to where it is: no trip
        values.to(dtype=torch.float64)
        torch.repeat_interleave(values, torch.tensor([1, 2, 3]), output_size=6)
        values.repeat_interleave(2)
        torch.stack([found.float(), values.sum()])
        len(values), values.shape[0]
    assert syncs.total == 0, dict(syncs.counts)
