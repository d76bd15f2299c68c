"""torch.distributed setup and teardown, rank helpers: the one place for both.

A process started by ``torchrun`` has RANK, WORLD_SIZE and LOCAL_RANK (and MASTER_ADDR,
MASTER_PORT) in its environment; everything else runs as a single process, world size 1,
and every helper here degrades to a no-op.
"""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from nmt.errors import NmtError

TIMEOUT = datetime.timedelta(minutes=30)


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_info() -> DistInfo:
    """Rank layout from the torchrun environment variables (world size 1 without them)."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise NmtError("RANK/WORLD_SIZE/LOCAL_RANK must be integers (set by torchrun)") from None
    if world < 1 or not 0 <= rank < world:
        raise NmtError(f"RANK={rank} WORLD_SIZE={world}: invalid distributed environment")
    return DistInfo(rank, world, local)


def init_distributed(device: torch.device) -> tuple[DistInfo, torch.device]:
    """Join the process group when WORLD_SIZE > 1: NCCL on CUDA, gloo on CPU.

    Returns the rank layout and the device this rank should use (cuda:LOCAL_RANK on GPUs).
    """
    info = env_info()
    if info.world_size == 1:
        return info, device
    if device.type == "cuda":
        gpus = torch.cuda.device_count()
        if info.local_rank >= gpus:
            raise NmtError(
                f"LOCAL_RANK={info.local_rank} but this machine has {gpus} CUDA device(s): "
                "start at most one process per GPU (torchrun --nproc_per_node), or train on the CPU (train.device=cpu)"
            )
        device = torch.device("cuda", info.local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend=backend, timeout=TIMEOUT, **kwargs)
    return info, device


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if is_distributed():
        dist.barrier()


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over ranks, in place; returns the tensor."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max(tensor: torch.Tensor) -> torch.Tensor:
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast(tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
    if is_distributed():
        dist.broadcast(tensor, src=src)
    return tensor


def teardown() -> None:
    """Leave the process group (safe to call when none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def torchrun_args(nproc: int, argv: list[str]) -> list[str]:
    """torchrun's arguments (`torchrun ARGS`) that run `nmt <argv>` as `nproc` local processes.

    `--nproc` is dropped from argv (each process is one rank), and `--` keeps torchrun's own
    parser away from nmt's options (it would read `--run` as an abbreviation of `--run-path`).
    """
    args, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            args.append(arg)
    return ["--standalone", f"--nproc_per_node={nproc}", "-m", "nmt", "--", *args]


def launch_with_torchrun(nproc: int, argv: list[str]) -> int:
    """Re-run this command line as `nproc` processes on this machine with torchrun's launcher, run
    in this process so that a failed rank ends in its own one-line error and one line here naming
    it (torchrun as a command adds its own traceback); the exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    try:
        run(get_args_parser().parse_args(torchrun_args(nproc, argv)))
    except ChildFailedError as failed:
        rank, first = failed.get_first_failure()  # the others were stopped because of it
        print(f"error: training process {rank} of {nproc} failed (exit code {first.exitcode}); its message is above",
              file=sys.stderr)  # fmt: skip
        return first.exitcode if first.exitcode > 0 else 1
    return 0
