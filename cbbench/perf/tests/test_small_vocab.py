"""A model whose vocabulary ends below the synthetic workloads' default id range (a local folder of a 32k-vocabulary
model, the test suites' tiny-qwen2-8k) gets prompt and warm-up ids it accepts, where it used to fail its first
request with "outside the vocabulary"."""

from __future__ import annotations

from cbbench.perf.backends.backend import warmup_prompts
from cbbench.perf.plan.load import known_vocab_size, vocab_token_id_range
from cbbench.perf.plan.options import WorkloadOptions, workload_kwargs
from cbbench.workloads.synthetic import DEFAULT_TOKEN_ID_RANGE


def test_the_id_range_shrinks_to_the_vocabulary_only_when_it_must():
    assert vocab_token_id_range("tiny-qwen2", DEFAULT_TOKEN_ID_RANGE) is None  # 151936 rows: the default fits
    assert vocab_token_id_range("tiny-qwen2-8k", DEFAULT_TOKEN_ID_RANGE) == (1000, 8192)
    assert vocab_token_id_range("tiny-qwen2-8k", (5000, 9000)) == (1024, 8192)  # lo moves below the top too
    assert vocab_token_id_range("Qwen/Qwen2.5-7B-Instruct", DEFAULT_TOKEN_ID_RANGE) is None  # a served name
    assert vocab_token_id_range(None, DEFAULT_TOKEN_ID_RANGE) is None  # options built without a model


def test_workload_params_take_the_fitted_range_but_a_baseline_keeps_its_own():
    random = WorkloadOptions("random")
    assert workload_kwargs(random, "tiny-qwen2-8k", on_cpu=True)["token_id_range"] == (1000, 8192)
    recorded = {"input_len": 8, "token_id_range": [10, 20]}  # `--like`: the baseline's params, as they were
    like = WorkloadOptions("random", recorded=recorded)
    assert workload_kwargs(like, "tiny-qwen2-8k", on_cpu=True) == recorded
    assert "token_id_range" not in workload_kwargs(random, "tiny-qwen2", on_cpu=True)


def test_a_served_model_s_vocabulary_is_known_only_for_a_preset_or_a_local_folder():
    """What the HTTP backends fold their warm-up ids into (perf/tests/test_http_vs_inprocess.py serves the 8k model)."""
    assert known_vocab_size("tiny-qwen2-8k") == 8192 and known_vocab_size("tiny-qwen2") == 151936
    assert known_vocab_size("Qwen/Qwen2.5-7B-Instruct") is None and known_vocab_size(None) is None


def test_warmup_ids_fold_into_the_vocabulary():
    plain, folded = warmup_prompts(3, seed=0), warmup_prompts(3, seed=0, vocab_size=8192)
    assert max(max(p) for p in plain) >= 8192
    assert folded == [[t % 8192 for t in p] for p in plain]
