"""The Device seam (refengine/worker/device.py): make_device (refengine/engine/platform.py) chooses once, each device
answers for itself, the engine asks its device (KV pool, memory check, runner, pacer) instead of branching on the
kind, and no engine module outside the device modules knows that simulated GPUs exist."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import refengine.engine.llm_engine as engine_module
from refengine import LLMEngine
from refengine.clock import WALL_CLOCK
from refengine.config import EngineConfig
from refengine.engine.engine_args import EngineArgs
from refengine.engine.platform import make_device
from refengine.models.presets import TEST_MODEL
from refengine.sim.pacing import StepPacer
from refengine.sim.sim_device import SimDevice
from refengine.worker.device import LocalDevice

ENGINE_ROOT = Path(__file__).resolve().parents[1]
# the modules that may know about simulated GPUs: the one place that chooses a device, and the simulation's package
DEVICE_MODULES = ("engine/platform.py", "sim/")


def config(**kwargs: object) -> EngineConfig:
    model = kwargs.pop("model", TEST_MODEL)
    return EngineArgs.from_kwargs(str(model), **kwargs).create_configs()


def test_make_device_picks_the_local_device_for_the_cpu_and_the_simulated_one_for_sim() -> None:
    local = make_device(config(device="cpu"))
    assert isinstance(local, LocalDevice) and not local.simulated and local.clock is WALL_CLOCK
    assert local.label == "cpu" and local.parts[2] is not None  # the weights are loaded
    sim = make_device(config(model="llama-3.1-8b", device="sim:h200"))
    assert isinstance(sim, SimDevice) and sim.simulated and sim.clock.simulated
    assert sim.label.startswith(f"simulated {sim.gpu.name} (cost model") and sim.parts[2] is None  # no weights


def test_only_a_simulated_device_paces_its_steps() -> None:
    def step() -> list:
        return []

    assert make_device(config(device="cpu")).make_pacer(step) is None
    sim = make_device(config(model="llama-3.1-8b", device="sim:h200"))
    pacer = sim.make_pacer(step)
    assert isinstance(pacer, StepPacer) and pacer.clock is sim.clock


def test_the_local_device_refuses_tensor_parallelism_before_loading_anything() -> None:
    # (a folder that does not exist: had it tried to load first, the error would name the model)
    cfg = config(device="cpu", tensor_parallel_size=2, model="/no/such/model/folder")
    with pytest.raises(ValueError, match=r"^tensor_parallel_size=2: refengine's forward runs on one device; "):
        LocalDevice.create(cfg)


def test_the_simulated_device_takes_tensor_parallel_size_and_refuses_a_split_it_does_not_simulate() -> None:
    assert SimDevice.create("sim:h200", "llama-3.1-8b", "bfloat16", 1).tensor_parallel_size == 1
    assert SimDevice.create("sim:h200", "llama-3.1-8b", "bfloat16", 4).tensor_parallel_size == 4
    with pytest.raises(ValueError, match=r"^tensor_parallel_size=3: not simulated"):
        SimDevice.create("sim:h200", "llama-3.1-8b", "bfloat16", 3)
    with pytest.raises(ValueError, match="tensor_parallel_size=16: not simulated"):
        LLMEngine("llama-3.1-8b", device="sim:h200", tensor_parallel_size=16)


class CountingDevice(LocalDevice):
    """A local device whose KV pool is a fixed size, recording what the engine asked of it."""

    BLOCKS = 37

    def __init__(self, device: LocalDevice) -> None:
        super().__init__(device.parts)
        self.asked: list[str] = []

    def num_gpu_blocks(self, cfg: EngineConfig, *, max_model_len: int) -> int:
        self.asked.append("num_gpu_blocks")
        return self.BLOCKS

    def check_memory(self, cfg: EngineConfig, *, num_rows: int, kv_given: bool) -> None:
        self.asked.append(f"check_memory(kv_given={kv_given}, blocks={cfg.scheduler.num_gpu_blocks})")


def test_the_engine_sizes_its_kv_pool_and_checks_memory_through_its_device(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[CountingDevice] = []

    def counting(cfg: EngineConfig, model_impl: object = None) -> CountingDevice:
        made.append(CountingDevice(LocalDevice.create(cfg)))
        return made[-1]

    monkeypatch.setattr(engine_module, "make_device", counting)
    engine = LLMEngine(TEST_MODEL, device="cpu")
    assert engine.platform is made[0] and engine.config.scheduler.num_gpu_blocks == CountingDevice.BLOCKS
    assert made[0].asked == ["num_gpu_blocks", f"check_memory(kv_given=False, blocks={CountingDevice.BLOCKS})"]
    LLMEngine(TEST_MODEL, device="cpu", num_gpu_blocks=9)  # given: the device is not asked to size the pool
    assert made[1].asked == ["check_memory(kv_given=True, blocks=9)"]


def _engine_modules_outside_the_device_modules() -> list[Path]:
    return [
        p
        for p in sorted(ENGINE_ROOT.rglob("*.py"))
        if "tests" not in p.relative_to(ENGINE_ROOT).parts
        and not str(p.relative_to(ENGINE_ROOT)).startswith(DEVICE_MODULES)
    ]


def _sim_imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom)
            else []
        )
        found += [n for n in names if n == "refengine.sim" or n.startswith("refengine.sim.")]
    return found


def test_no_engine_module_outside_the_device_modules_imports_the_simulation() -> None:
    """What differs on a simulated GPU is the device's to say: a module that imports refengine.sim to ask whether
    it runs on one (is_sim_device, SimDevice) has put an `if sim` back outside the seam."""
    modules = _engine_modules_outside_the_device_modules()
    assert (
        ENGINE_ROOT / "engine" / "llm_engine.py" in modules and ENGINE_ROOT / "entrypoints" / "api_server.py" in modules
    )
    offenders = {str(p.relative_to(ENGINE_ROOT)): names for p in modules if (names := _sim_imports(p))}
    assert offenders == {}


def test_the_sim_import_check_sees_an_import(tmp_path: Path) -> None:
    """The check can fail: it finds both spellings of an import of the simulation."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import refengine.sim.cost_model\ndef f():\n    from refengine.sim.sim_device import is_sim_device\n"
    )
    assert _sim_imports(planted) == ["refengine.sim.cost_model", "refengine.sim.sim_device"]


def test_device_spec_reads_a_device_string_without_building_an_engine() -> None:
    """DeviceSpec is the one reading of a device string: what it names and what differs for it, asked without an
    engine (perf plans with it before torch is imported)."""
    from refengine.sim.gpus import GPUS
    from refengine.sim.sim_device import DeviceSpec

    cpu, cuda, cuda1, sim, other = (DeviceSpec.parse(d) for d in ("cpu", "cuda", "cuda:1", " SIM:H200 ", "mps"))
    assert (cpu.is_cpu, cpu.is_cuda, cpu.simulated) == (True, False, False)
    assert cuda.is_cuda and cuda1.is_cuda and not cuda1.simulated and cuda1.label == "cuda:1"
    assert sim.simulated and sim.gpu is GPUS["h200"] and sim.label == "simulated H200" and sim.name == " SIM:H200 "
    assert sim.tensor_parallel_ok and not cpu.tensor_parallel_ok and not cuda.tensor_parallel_ok
    assert other.kind == "other" and not other.simulated
    with pytest.raises(ValueError, match=r"^device 'sim:h9' is not a simulated GPU; known: sim:h100"):
        DeviceSpec.parse("sim:h9")
    for refused in ("mps", "cpu:0", "tpu", ""):  # the command line's rule: cpu, cuda[:N] or a simulated GPU
        with pytest.raises(ValueError, match=r"^device must be cpu, cuda, cuda:N or a simulated GPU \(sim:h100"):
            DeviceSpec.checked(refused)
    assert DeviceSpec.checked("cuda:3").is_cuda


def test_make_device_asks_the_device_spec() -> None:
    """An unknown simulated GPU is refused by the same reading, before any model is looked up."""
    with pytest.raises(ValueError, match=r"^device 'sim:h9' is not a simulated GPU"):
        make_device(EngineConfig(model="no-such-model", device="sim:h9"))
