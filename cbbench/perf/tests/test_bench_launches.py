"""`python -m benchmarks.launches` (benchmarks/launches.py): it runs, and what it counts follows the model
(not a target value: the counts are the benchmark's to print). torch.profiler's first use in a process costs
seconds, so the refengine counts share one test; the transformers twin's (an import of transformers more) is slow."""

from __future__ import annotations

import pytest

from benchmarks.launches import count_refengine, count_transformers, format_table
from refengine.models.presets import PRESETS

TOY = PRESETS["tiny-qwen2"].replace(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=1, eos_token_id=None
)


def test_counts_follow_the_number_of_layers_and_the_path():
    one, _ = count_refengine(TOY, "torch")
    two, _ = count_refengine(TOY.replace(num_hidden_layers=2), "torch")
    assert one.layer_kernels > one.layer_attention_kernels > 0 and one.triton == 0
    # a second layer adds its own launches to the forward and nothing else (it is not the first layer's twin: the
    # first takes no residual to add)
    added = two.layer_kernels - one.layer_kernels
    assert two.kernels - one.kernels == added > 0
    assert two.torch_ops - one.torch_ops == two.layer_torch_ops - one.layer_torch_ops > 0
    triton, _ = count_refengine(TOY, "triton")  # (TRITON_INTERPRET on a CPU: conftest.py)
    assert 0 < triton.layer_triton <= triton.layer_kernels < one.layer_kernels
    table = format_table([one, triton])
    assert "refengine torch" in table and "refengine triton" in table


@pytest.mark.slow
def test_transformers_twin_counts_and_ratios():
    one, lm = count_refengine(TOY, "torch")
    triton, _ = count_refengine(TOY, "triton")
    hf = count_transformers(lm, TOY)
    assert hf.layer_kernels > hf.layer_attention_kernels > 0 and hf.num_layers == 1
    ratios = format_table([one, triton, hf]).splitlines()[-2:]
    assert ratios[0].startswith("transformers / refengine torch") and ratios[1].startswith(
        "transformers / refengine triton"
    )
