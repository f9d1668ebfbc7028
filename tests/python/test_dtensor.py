"""DTensor under torchrun, 2 gloo ranks on the CPU, recorded.

A DTensor is a wrapper subclass: its data is its shard (`_local_tensor`), with a version counter of
its own. Writing the shard of a DTensor that an op saved (`w.to_local().mul_(2)` under no_grad)
moves only the shard's counter: PyTorch raises nothing and backward computes the gradient from the
changed values. The recorder ties each DTensor to its shard (TensorInfo.inner), so the replayer
reports that write (kind `silent`) with its line, on the rank that made it; a write through the
DTensor itself stays the one version error PyTorch raises; updating the shard after backward (an
optimizer written against shards) is fine. Tensor parallelism (`parallelize_module`) the same way:
a weight clamped through its shard between forward and backward is reported on every rank."""
import textwrap

from conftest import marker_line, needs_build, record_ranks, same_file

pytestmark = needs_build

PROGRAM = textwrap.dedent("""\
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)


    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))  # TP_SAVED


    def tensor_parallel(clamp_step):
        model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(),
                                                 "down": RowwiseParallel()})
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x = torch.randn(4, 16)
        for step in range(3):
            loss = model(x).sum()
            if step == clamp_step:
                with torch.no_grad():
                    model.down.weight.to_local().clamp_(-0.1, 0.1)  # CLAMP
            loss.backward()
            opt.step()
            opt.zero_grad()


    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mode = sys.argv[1]
    torch.manual_seed(0)
    if mode.startswith("tensor_parallel"):
        tensor_parallel(1 if mode == "tensor_parallel_clamp" else None)
        dist.destroy_process_group()
        sys.exit(0)
    w = distribute_tensor(torch.randn(8, 8), mesh, [Replicate()]).requires_grad_()
    v = distribute_tensor(torch.randn(8, 8), mesh, [Shard(0)]).requires_grad_()
    x = distribute_tensor(torch.randn(4, 8), mesh, [Replicate()]).requires_grad_()
    for step in range(3):
        h = torch.mm(x, w)  # SAVED
        s = torch.sin(v)  # SHARD_SAVED
        if rank == 1 and step == 1:
            with torch.no_grad():
                if mode == "shard_write":
                    w.to_local().mul_(2)  # SHARD_WRITE
                elif mode == "sharded_write":
                    v.to_local().add_(1)  # SHARDED_WRITE
                elif mode == "wrapper_write":
                    w.mul_(2)  # WRAPPER_WRITE
        (h.sum() + s.sum()).backward()
        with torch.no_grad():
            for p in (x, w, v):
                p.to_local().sub_(0.1 * p.grad.to_local())  # UPDATE
                p.grad = None
    dist.destroy_process_group()
    """)


def test_dtensor_clean_training_has_no_violation(tmp_path):
    _, documents, codes = record_ranks(tmp_path, "dtensor.py", PROGRAM, "clean")
    for rank, document in documents.items():
        assert document["violations"] == [], (rank, document["violations"][:1])
        assert codes[rank] == 0, (rank, document["unexplained_errors"], document["warnings"])


def test_dtensor_shard_write_is_reported_on_its_rank(tmp_path):
    script, documents, codes = record_ranks(tmp_path, "dtensor.py", PROGRAM, "shard_write")
    assert documents[0]["violations"] == []
    assert codes[1] == 1
    violations = documents[1]["violations"]
    assert len(violations) == 1, violations
    v = violations[0]
    assert v["kind"] == "silent" and v["pytorch_raised"] is False
    assert same_file(v["culprit"]["user_frame"]["file"], script)
    assert v["culprit"]["user_frame"]["line"] == marker_line(script, "SHARD_WRITE")
    assert v["victim"]["user_frame"]["line"] == marker_line(script, "SAVED")


def test_dtensor_sharded_write_is_reported(tmp_path):
    script, documents, codes = record_ranks(tmp_path, "dtensor.py", PROGRAM, "sharded_write")
    assert documents[0]["violations"] == []
    violations = documents[1]["violations"]
    assert [v["kind"] for v in violations] == ["silent"], violations
    assert violations[0]["culprit"]["user_frame"]["line"] == marker_line(script, "SHARDED_WRITE")
    assert violations[0]["victim"]["user_frame"]["line"] == marker_line(script, "SHARD_SAVED")


def test_dtensor_own_inplace_write_is_the_one_error_pytorch_raises(tmp_path):
    script, documents, codes = record_ranks(tmp_path, "dtensor.py", PROGRAM, "wrapper_write")
    violations = documents[1]["violations"]
    assert len(violations) == 1, violations
    v = violations[0]
    assert v["kind"] == "version" and v["pytorch_raised"] is True
    assert v["culprit"]["user_frame"]["line"] == marker_line(script, "WRAPPER_WRITE")
    assert v["victim"]["user_frame"]["line"] == marker_line(script, "SAVED")
    assert documents[1]["unexplained_errors"] == []


def test_tensor_parallel_clean_then_a_weight_clamped_between_forward_and_backward(tmp_path):
    _, documents, codes = record_ranks(tmp_path, "dtensor.py", PROGRAM, "tensor_parallel")
    assert documents[0]["violations"] == [] and documents[1]["violations"] == []
    assert codes == {0: 0, 1: 0}
    script, documents, codes = record_ranks(tmp_path, "dtensor.py", PROGRAM,
                                            "tensor_parallel_clamp")
    for rank in (0, 1):
        violations = documents[rank]["violations"]
        assert [v["kind"] for v in violations] == ["silent"], (rank, violations)
        assert violations[0]["culprit"]["user_frame"]["line"] == marker_line(script, "CLAMP")
        assert violations[0]["victim"]["user_frame"]["line"] == marker_line(script, "TP_SAVED")
        assert violations[0]["tensor"]["inner"] is not None
