"""cbbench beside another distribution's `kernels` (Hugging Face's, which transformers >= 5.25 installs): the engine
imports its own kernels as `cbbench.kernels`, and a bare `import kernels` finds the other package, even with the
repository's root, which holds the link kernels/ -> cbbench/kernels/, first on the path (pytest, `python -m`, a
script run from the checkout). Where no other package has a bare name, it is cbbench's own package, one module under
two names, never a second copy.

The other package is made here (a `kernels` package with its dist-info, on PYTHONPATH), so the test needs no
download and fails if the repository's kernels/ link shadows it or if refengine reaches for a top-level `kernels`.
Where the real Hugging Face `kernels` is installed, transformers' own use of it is checked too.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(code: str, pythonpath: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath)), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _other_kernels(root: Path) -> Path:
    """A distribution named `kernels` whose package says whose it is."""
    (root / "kernels").mkdir(parents=True)
    (root / "kernels" / "__init__.py").write_text("OWNER = 'another project'\n")
    info = root / "kernels-0.0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.0.1\n")
    return root


def test_the_engine_runs_beside_another_kernels_package(tmp_path: Path) -> None:
    other = _other_kernels(tmp_path / "site")
    # the repository's root first, as pytest and `python -m` put it, then the other package
    res = _run(
        """
        import sys
        import kernels
        assert getattr(kernels, "OWNER", None) == "another project", kernels
        from refengine import LLM, SamplingParams
        llm = LLM("tiny-qwen2", device="cpu", num_gpu_blocks=64, attention_backend="triton")
        out = llm.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0))
        assert len(out[0].outputs[0].token_ids) == 4
        import cbbench.kernels.triton_unified_attention as ua
        assert ua.__file__.startswith(sys.argv[1]), ua.__file__
        print("ok")
        """,
        [REPO, other],
        str(REPO / "cbbench" / "kernels"),
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


@pytest.mark.skipif(
    not any(
        (d.read_text("top_level.txt") or "").split() == ["kernels"] or d.metadata["Name"] == "kernels"
        for d in importlib.metadata.distributions()
        if d.metadata["Name"] == "kernels"
    ),
    reason="Hugging Face's kernels is not installed here (transformers < 5.25 does not require it)",
)
def test_transformers_uses_its_kernels_from_the_repository_root() -> None:
    """transformers imports `kernels` itself (its hub-kernels integration): from the repository's root it must get
    Hugging Face's package, not the kernels/ folder, or loading a model fails."""
    res = _run(
        """
        import kernels, transformers
        assert hasattr(kernels, "get_kernel"), kernels.__file__
        from transformers import Qwen2Config, Qwen2ForCausalLM
        cfg = Qwen2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
        Qwen2ForCausalLM(cfg)
        print("ok")
        """,
        [REPO],
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_a_bare_name_no_other_package_has_is_cbbench_s_own_package() -> None:
    """`perf` and `workloads` (no distribution here has them) from the repository's root: the same module objects as
    cbbench.perf and cbbench.workloads, so nothing of cbbench is loaded twice."""
    res = _run(
        """
        import perf, workloads, cbbench.perf, cbbench.workloads
        from perf import compare
        from cbbench.perf.results.compare import compare as the_compare
        assert perf is cbbench.perf and workloads is cbbench.workloads, (perf, workloads)
        assert compare is the_compare
        print("ok")
        """,
        [REPO],
    )
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]
