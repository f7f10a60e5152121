"`launch`, the notebooks' way to run a function on N gloo processes."
import torch
from cifar_ddp_tut.lessons.procs import launch


def rank_tensor(env):
    "A worker that returns a tensor (spawned processes import it from this module)."
    return torch.full((100_000,), float(env.rank))


def test_launch_returns_tensors_from_every_rank():
    # torch's queue sends a tensor as shared memory that dies with its sender; a rank that had
    # exited before its result was read left `launch` waiting until its timeout
    results = launch(rank_tensor, 2, timeout_s=120)
    assert [r.sum().item() for r in results] == [0.0, 100_000.0]
