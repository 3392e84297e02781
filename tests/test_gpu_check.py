"""bench/gpu_check.py cannot rot while no GPU is lent: its dry run (`check DIR --device cpu`) runs every check —
δ_TCB against the float64 Jacobian, 4-bit and 8-bit loads served as the scorer answers, --batch-size auto halving
on out-of-memory, the cards served in-process and over HTTP — on the CPU, from the folder `prepare` writes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.clirun import REPO

pytestmark = pytest.mark.slow


@pytest.mark.long
def test_the_gpu_check_dry_runs_on_the_cpu(tmp_path):
    pytest.importorskip("bitsandbytes")
    script = REPO / "bench" / "gpu_check.py"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    prepared = subprocess.run(
        [sys.executable, script, "prepare", tmp_path], capture_output=True, text=True, env=env, timeout=900
    )
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    checked = subprocess.run(
        [sys.executable, script, "check", tmp_path, "--device", "cpu"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr[-3000:]
    out = checked.stdout
    assert "device: cpu (dry run)" in out
    assert "4-bit nf4 (double quant, compute float32) on cpu: 14 layers quantized" in out
    assert "8-bit llm.int8 (outlier threshold 6.0) on cpu: 14 layers quantized" in out
    assert out.count("served 84/84 as the scorer") == 2
    assert "halved on: True" in out and "kept 8; 84/84 answers as batch 8" in out
    assert "batch card over HTTP on cpu" in out and "ensemble card over HTTP on cpu" in out
