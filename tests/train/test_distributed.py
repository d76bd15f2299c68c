from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from nmt.errors import NmtError
from nmt.run import weights as ckpt
from nmt.train import distributed as dist

pytestmark = pytest.mark.slow  # torchrun starts processes that train
ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def test_env_info(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert dist.env_info() == dist.DistInfo(0, 1, 0)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    info = dist.env_info()
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (3, 4, 1, False)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(NmtError, match="RANK=4"):
        dist.env_info()


def test_single_process_helpers_are_no_ops(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info, device = dist.init_distributed(torch.device("cpu"))
    assert info.world_size == 1 and device == torch.device("cpu")
    assert not dist.is_distributed() and dist.is_main() and dist.rank() == 0 and dist.world_size() == 1
    t = torch.tensor([2.0])
    assert dist.all_reduce_sum(t) is t and t.item() == 2.0
    dist.barrier()
    dist.teardown()


def test_more_processes_than_gpus_is_a_one_line_error(monkeypatch):
    """torchrun --nproc_per_node=2 on a machine with one GPU: rank 1 names the problem instead of
    failing in set_device (seen on an H200 machine: the other rank then died in gloo)."""
    for key, value in (("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(NmtError, match=r"LOCAL_RANK=1 but this machine has 1 CUDA device.*nproc_per_node"):
        dist.init_distributed(torch.device("cuda"))
    assert not torch.distributed.is_initialized()


SCRIPT = """
import json, os, sys
from pathlib import Path
sys.path[:0] = [{tests!r}, str(Path({tests!r}).parent)]  # test_train, and the learning helper it imports
import torch
from nmt.train import distributed as dist
from test_train import synth_config
from toy_runs import Steps
from nmt.train.loop import fit

info, _ = dist.init_distributed(torch.device("cpu"))  # fit() joins the same group
ranks = dist.all_reduce_sum(torch.tensor([float(info.rank)])).item()
steps = Steps()
summary = fit(synth_config(*{overrides!r}), Path({run!r}), on_step=steps)
if info.rank == 0:
    Path({out!r}).write_text(json.dumps({{"losses": steps.losses, "summary": summary, "ranks": ranks}}))
"""

OVERRIDES = [
    "train.max_steps=8",
    "train.max_tokens=300",
    "train.warmup=4",
    "train.lr=0.003",
    "train.eval_every=8",
    "train.eval_sentences=8",
    "train.seed=5",
    "train.device=cpu",  # gloo on the CPU, also on a machine with a GPU
]


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed next to python")
def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tmp_path):
    from test_train import synth_config, synthetic_run
    from toy_runs import Steps

    from nmt.train.loop import fit

    for name in ("ddp", "single"):
        synthetic_run(tmp_path / name, "reverse", n_train=1000, n_valid=8)  # > 16 batches: 8 steps in epoch 0
    out = tmp_path / "ddp.json"
    script = tmp_path / "ddp_train.py"
    overrides = [*OVERRIDES, "train.update_freq=1"]
    tests = str(Path(__file__).parent)
    script.write_text(SCRIPT.format(tests=tests, overrides=overrides, run=str(tmp_path / "ddp"),
                                    out=str(out)))  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ddp = json.loads(out.read_text())
    assert ddp["ranks"] == 1.0 and ddp["summary"]["steps"] == 8

    single = Steps()
    fit(synth_config(*OVERRIDES, "train.update_freq=2"), tmp_path / "single", on_step=single)
    assert len(ddp["losses"]) == len(single.losses) == 8
    for a, b in zip(ddp["losses"], single.losses, strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    wa, _ = ckpt.load_weights(tmp_path / "ddp" / "checkpoints" / "step_8.safetensors")
    wb, _ = ckpt.load_weights(tmp_path / "single" / "checkpoints" / "step_8.safetensors")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-4, atol=1e-5, msg=k)


def run_ddp(tmp_path: Path, run: Path, overrides: list[str]) -> dict:
    """`fit` on two gloo processes (torchrun) on `run`; rank 0's losses and summary."""
    out, script = tmp_path / f"{run.name}.json", tmp_path / f"{run.name}_train.py"
    tests = str(Path(__file__).parent)
    script.write_text(SCRIPT.format(tests=tests, overrides=overrides, run=str(run), out=str(out)))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [str(TORCHRUN), "--standalone", "--nproc_per_node=2", str(script)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed next to python")
def test_a_run_saved_on_two_ranks_resumes_exactly_on_one(tmp_path):
    """Two ranks train 4 updates (a checkpoint mid-epoch), one process (the same global batch:
    update_freq 2) trains on from it: the updates after the checkpoint are those of an uninterrupted
    single-process run, because the rest of the epoch is shared out anew, not dropped."""
    from test_train import synth_config, synthetic_run
    from toy_runs import Steps

    from nmt.train.loop import fit

    for name in ("ddp", "single"):
        synthetic_run(tmp_path / name, "reverse", n_train=1000, n_valid=8)  # > 16 batches: 8 steps in epoch 0
    first = run_ddp(tmp_path, tmp_path / "ddp", [*OVERRIDES, "train.update_freq=1", "train.max_steps=4",
                                                 "train.eval_every=4"])  # fmt: skip
    assert first["summary"]["steps"] == 4
    resumed, single = Steps(), Steps()
    fit(synth_config(*OVERRIDES, "train.update_freq=2"), tmp_path / "ddp", on_step=resumed)
    fit(synth_config(*OVERRIDES, "train.update_freq=2"), tmp_path / "single", on_step=single)
    assert len(resumed.losses) == 4 and len(single.losses) == 8
    for a, b in zip(first["losses"] + resumed.losses, single.losses, strict=True):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-5)
    log = (tmp_path / "ddp" / "train.log").read_text()
    assert "resuming on 1 ranks (saved with 2): the data continues at batch 8 of epoch 0" in log


@pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun not installed next to python")
def test_a_failed_rank_ends_nproc_training_in_one_line_not_a_traceback(tmp_path):
    """`nmt train --nproc 2` whose ranks stop on an error: each rank's one-line error, then one
    line naming the first rank that failed, a non-zero exit, and no traceback of the launcher's."""
    cmd = [sys.executable, "-m", "nmt", "train", "--nproc", "2", "--config", str(ROOT / "configs" / "tiny.yaml"),
           "--run", str(tmp_path / "run"), "--mirror", str(tmp_path / "missing")]  # fmt: skip
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=240, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1
    assert "mirror directory not found" in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip().splitlines()[-1].startswith("error: training process ")


def test_torchrun_args_pass_nmt_options_through():
    from torch.distributed.run import get_args_parser

    from nmt.train.distributed import torchrun_args

    args = torchrun_args(2, ["train", "--config", "c.yaml", "--nproc", "2", "--run", "r", "--nproc=2"])
    assert "--nproc_per_node=2" in args
    assert args[args.index("nmt") + 1 :] == ["--", "train", "--config", "c.yaml", "--run", "r"]
    parsed = get_args_parser().parse_args(args)  # as the launcher reads them
    assert parsed.module and parsed.training_script == "nmt"
    assert parsed.training_script_args == ["train", "--config", "c.yaml", "--run", "r"]
