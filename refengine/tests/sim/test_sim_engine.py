"""device="sim:<gpu>" on LLM / LLMEngine: device and dtype checks, fixed tokens, max_tokens, virtual time."""

from __future__ import annotations

import pytest

from benchmarks.engine_replay import replay
from refengine import LLM, LLMEngine
from refengine.sim.cost_model import COST_MODEL_VERSION
from refengine.sim.gpus import GPUS
from refengine.sim.runner import SIM_TOKEN_ID
from refengine.tests.sim.helpers import params, workload


@pytest.mark.parametrize("device", ["sim:v100", "sim:", "sim:h200x", "simulated:h200"])
def test_bad_sim_device_names_device_and_known_gpus(device):
    with pytest.raises(ValueError, match="device") as exc:
        LLMEngine("qwen2.5-0.5b", device=device)
    if device.startswith("sim:"):
        for gpu in GPUS:
            assert f"sim:{gpu.lower()}" in str(exc.value)


def test_sim_device_names_ignore_case():
    from refengine.sim.sim_device import parse_sim_device

    assert parse_sim_device("SIM:H100 ") == parse_sim_device("sim:h100") != parse_sim_device("sim:h200")


def test_bad_sim_dtype_and_model_are_refused():
    with pytest.raises(ValueError, match="dtype"):
        LLMEngine("qwen2.5-0.5b", device="sim:h100", dtype="float32")
    with pytest.raises(ValueError, match="model"):
        LLMEngine("no-such-model", device="sim:h100")


# every preset and every GPU at least once (qwen2.5-0.5b's pool is ~700k blocks on an H200: slow to build, so once)
@pytest.mark.parametrize(
    ("model", "gpu"),
    [
        ("qwen2.5-0.5b", "a100"),
        ("qwen2.5-7b", "h200"),
        ("llama-3.1-8b", "h100"),
        ("llama-3.1-8b", "a100"),
        ("opt-13b", "h200"),
    ],
)
def test_presets_run_with_fixed_tokens_to_max_tokens(gpu, model):
    with LLM(model, device=f"sim:{gpu}", gpu_memory_utilization=0.5) as llm:
        engine = llm.llm_engine
        assert engine.model is None and engine.device_label.startswith(f"simulated {engine.platform.gpu.name}")
        assert COST_MODEL_VERSION in engine.device_label
        outs = llm.generate(["Hello there", [5, 6, 7]], [params(3), params(7)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 7]
    assert all(t == SIM_TOKEN_ID for o in outs for t in o.outputs[0].token_ids)
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_fp8_and_token_ids_checked_against_the_preset_vocab():
    engine = LLMEngine("opt-13b", device="sim:h200", dtype="fp8")
    with pytest.raises(ValueError, match="prompt"):
        engine.add_request("x", [50272], params(2))  # OPT's vocabulary is 50272 ids
    engine.add_request("ok", [50271], params(2))
    assert engine.get_num_unfinished_requests() == 1


def test_local_config_json(tmp_path):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "architectures": ["LlamaForCausalLM"],
                "hidden_size": 2048,
                "num_hidden_layers": 16,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 8192,
                "vocab_size": 128256,
                "max_position_embeddings": 8192,
                "eos_token_id": 128001,
                "hidden_act": "silu",
            }
        )
    )
    with LLM(str(tmp_path), device="sim:h100") as llm:
        out = llm.generate([[1, 2, 3]], params(4))[0]
    assert out.outputs[0].token_ids == [SIM_TOKEN_ID] * 4


def test_virtual_time_is_monotone_and_advances_by_step_seconds():
    engine = LLMEngine("llama-3.1-8b", device="sim:h100", max_num_batched_tokens=256)
    runner, clock = engine.model_runner, engine.clock
    for i, (prompt, n, _) in enumerate(workload(12, seed=3)):
        engine.add_request(str(i), prompt, params(n))
    done = []
    while engine.has_unfinished_requests():
        before = clock.now()
        done += [o.metrics for o in engine.step() if o.finished]
        # each step moves the clock by exactly the cost model's seconds for the shape it ran, nothing else
        seconds = runner.cost_model.step_seconds(runner.last_step)
        assert seconds > 0 and clock.now() == before + seconds
    assert runner.busy_seconds == pytest.approx(clock.now(), rel=1e-12)  # (all arrive at 0: no idle time)
    for m in done:
        times = [m["arrival_time"], m["first_scheduled_time"], m["first_token_time"], *m["token_times"]]
        assert times == sorted(times) and m["finish_time"] == m["token_times"][-1]
        assert len(set(m["token_times"])) == len(m["token_times"])  # one token per step: strictly increasing
    stamps = [s.time for s in engine.step_stats]
    assert stamps == sorted(stamps) and stamps[-1] == clock.now()


def test_idle_engine_jumps_to_the_next_arrival():
    engine = LLMEngine("llama-3.1-8b", device="sim:h100")
    metrics = replay(engine, [([1, 2, 3], 2, 0.0), ([4, 5, 6], 2, 100.0)])
    assert metrics[0]["finish_time"] < 1.0  # a few decode steps: milliseconds
    assert metrics[1]["arrival_time"] == metrics[1]["first_scheduled_time"] == 100.0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_same_inputs_give_bit_identical_timestamps(async_scheduling):
    reqs = workload(40, seed=1, gap=0.003)

    def run():
        engine = LLMEngine(
            "llama-3.1-8b",
            device="sim:h200",
            async_scheduling=async_scheduling,
            max_num_batched_tokens=512,
            stats_log_size=None,
        )
        return replay(engine, reqs), [(s.time, s.scheduled_req_ids) for s in engine.step_stats]

    first, second = run(), run()
    assert first == second  # exact: floats compared bit for bit


def test_step_shapes_given_to_the_cost_model():
    """A chunked prefill samples only at its last chunk; a decode step is one token per request over its context."""
    engine = LLMEngine("llama-3.1-8b", device="sim:h100", max_num_batched_tokens=128)
    engine.add_request("long", list(range(1000, 1300)), params(2))
    shapes = []
    while engine.has_unfinished_requests():
        engine.step()
        shapes.append(engine.model_runner.last_step)
    assert [(s.new_tokens, s.context_tokens, s.num_sampling_rows) for s in shapes] == [
        ((128,), (0,), 0),
        ((128,), (128,), 0),
        ((44,), (256,), 1),
        ((1,), (300,), 1),
    ]
