"""The backwards' weight-gradient partial sums, summed over their rows by one kernel (rowwise.sum_partials)."""

from __future__ import annotations

import pytest
import torch

from kernelgate.launch import call_state
from kernelgate.rowwise import sum_partials
from kernelgate.tolerance import assert_close


@pytest.fixture
def launches_on(target: torch.device, monkeypatch: pytest.MonkeyPatch) -> torch.device:
    """``target``, with sum_partials' launch interpreted on the CPU (as a launcher's is when its op is)."""
    monkeypatch.setattr(call_state, "interpret", target.type == "cpu")
    return target


def _expected(partial: torch.Tensor, param: torch.Tensor, k: int) -> torch.Tensor:
    return partial[k].double().sum(dim=0).to(param.dtype).view(param.shape)


@pytest.mark.parametrize(("rows", "cols"), [(70, 100), (1, 1), (3, 4096 + 17), (200, 7)])
def test_a_weight_and_a_bias_are_summed_each_in_its_dtype_and_shape(
    launches_on: torch.device, rows: int, cols: int
) -> None:
    """A bfloat16 weight and a float32 bias of ``cols`` elements (the bias shaped as a layer_norm's normalized_shape
    of two dimensions, where ``cols`` allows): each sum over the rows matches float64's, comes back in its
    parameter's dtype and shape, and owns its memory. The shapes leave partial tiles of rows (70 in tiles of 64) and
    of columns (100 in blocks of 64), a single element, and rows shorter than a tile of columns."""
    partial = torch.randn(2, rows, cols, device=launches_on)
    weight = torch.ones(cols, dtype=torch.bfloat16, device=launches_on)
    bias = torch.ones((2, cols // 2) if cols % 2 == 0 else (cols,), device=launches_on)
    dw, db = sum_partials(partial, [weight, bias])
    assert (dw.dtype, dw.shape, db.dtype, db.shape) == (torch.bfloat16, weight.shape, torch.float32, bias.shape)
    assert dw.untyped_storage().data_ptr() != db.untyped_storage().data_ptr()
    assert_close(dw, _expected(partial, weight, 0), reduction_length=rows)
    assert_close(db, _expected(partial, bias, 1), reduction_length=rows)


def test_one_parameter_is_summed_alone(launches_on: torch.device) -> None:
    """rms_norm's backward passes its weight's partial sums alone, as a batch of one."""
    partial = torch.randn(1, 33, 300, device=launches_on)
    weight = torch.ones(300, dtype=torch.float16, device=launches_on)
    (dw,) = sum_partials(partial, [weight])
    assert dw.dtype == torch.float16 and dw.shape == (300,)
    assert_close(dw, _expected(partial, weight, 0), reduction_length=33)


def test_no_rows_sum_to_zeros(launches_on: torch.device) -> None:
    """A backward over no rows has no partial sums: each gradient is zeros, not left unwritten."""
    weight = torch.ones(40, device=launches_on)
    (dw,) = sum_partials(torch.empty(1, 0, 40, device=launches_on), [weight])
    assert torch.equal(dw, torch.zeros_like(weight))


@pytest.mark.parametrize("params", [0, 3])
def test_a_parameter_count_other_than_the_partial_sums_rows_is_refused(params: int) -> None:
    """One or two parameters, as many as the partial sums' leading dimension: anything else is a launcher's bug,
    refused before a launch."""
    with pytest.raises(ValueError, match="rows of partial sums for"):
        sum_partials(torch.zeros(2, 3, 4), [torch.ones(4)] * params)
