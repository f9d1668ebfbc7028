"""FSDP2 (torch.distributed.fsdp.fully_shard) under torchrun, 2 gloo ranks on the CPU, recorded.

FSDP2 frees each unsharded parameter after forward and all-gathers it again before backward into
the same tensor under a preserved version counter: the saved weight's counter moved, the bytes
backward reads are the ones forward saved, and PyTorch is right to stay silent. Clean training
(resharding after forward or not, activation checkpointing, a frozen base with adapters, gradient
accumulation) must give no violation on any rank; a bug planted on one rank is reported in that
rank's trace only; an optimizer step between forward and backward, which the refill then brings
into the saved weight, is reported with the step's line."""
import textwrap

from conftest import marker_line, needs_build, record_ranks, same_file

pytestmark = needs_build

PROGRAM = textwrap.dedent("""\
    import sys
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import checkpoint


    class Block(torch.nn.Module):
        def __init__(self, lora=False):
            super().__init__()
            self.base = torch.nn.Linear(16, 16)
            self.lora_a = torch.nn.Linear(16, 4, bias=False) if lora else None
            self.lora_b = torch.nn.Linear(4, 16, bias=False) if lora else None
            self.checkpointed = False
            self.bug = False
            if lora:
                self.base.requires_grad_(False)

        def body(self, x):
            h = self.base(x)  # WEIGHT_SAVED
            if self.lora_a is not None:
                h = h + self.lora_b(self.lora_a(x))
            a = torch.sigmoid(h)  # VICTIM
            if self.bug:
                a.mul_(2)  # CULPRIT
            return a

        def forward(self, x):
            if self.checkpointed:
                return checkpoint(self.body, x, use_reentrant=False)
            return self.body(x)


    class Net(torch.nn.Module):
        def __init__(self, lora=False):
            super().__init__()
            self.blocks = torch.nn.ModuleList([Block(lora), Block(lora)])
            self.head = torch.nn.Linear(16, 1)

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.head(x)  # HEAD


    def build(reshard=True, lora=False, checkpointed=False):
        torch.manual_seed(0)
        net = Net(lora)
        for block in net.blocks:
            block.checkpointed = checkpointed
            fully_shard(block, reshard_after_forward=reshard)
        fully_shard(net, reshard_after_forward=reshard)
        params = [p for p in net.parameters() if p.requires_grad]
        return net, torch.optim.SGD(params, lr=0.1, momentum=0.9)


    def train(net, opt, steps=3, accumulate=1, bug_step=None, early_step=None, ema=None):
        x = torch.randn(4, 16)
        for step in range(steps):
            for micro in range(accumulate):
                if accumulate > 1:
                    net.set_requires_gradient_sync(micro == accumulate - 1)
                net.blocks[1].bug = step == bug_step
                out = net(x)
                if step == early_step:
                    opt.step()  # EARLY_STEP
                if ema is not None:
                    with torch.no_grad():  # Another model's weights, not sharded: legal here.
                        for p, q in zip(ema.parameters(), net.parameters()):
                            p.mul_(0.9)
                            p.clamp_(-1, 1)
                out.sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=False)  # Kept as zeros: an early step still moves (momentum).


    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    mode = sys.argv[1]
    if mode == "clean":
        for kwargs, accumulate in [({}, 1), ({"reshard": False}, 1), ({"checkpointed": True}, 1),
                                   ({"lora": True}, 1), ({}, 2)]:
            train(*build(**kwargs), accumulate=accumulate)
    elif mode == "bug":
        train(*build(), bug_step=1 if rank == 1 else None)
    elif mode == "early_step":
        train(*build(), early_step=1 if rank == 1 else None)
    elif mode == "ema":
        train(*build(), ema=Net())
    dist.destroy_process_group()
    """)


def test_fsdp2_clean_training_has_no_violation_on_any_rank(tmp_path):
    _, documents, codes = record_ranks(tmp_path, "fsdp.py", PROGRAM, "clean")
    for rank, document in documents.items():
        assert document["violations"] == [], (rank, document["violations"][:1])
        assert codes[rank] == 0, (rank, document["unexplained_errors"], document["warnings"])
        # The refills were seen and judged, not missed: each backward's all-gather put back a
        # saved weight.
        restored = document["restored_writes"]
        assert restored["count"] >= 20, (rank, restored["count"])
        writer = restored["listed"][0]["writer"]
        assert writer["op"] == "fsdp::split_with_sizes_copy", writer


def test_fsdp2_bug_on_one_rank_is_reported_there_only(tmp_path):
    script, documents, codes = record_ranks(tmp_path, "fsdp.py", PROGRAM, "bug")
    # Rank 0 has no bug: its backward fails only because rank 1 left the collective.
    assert documents[0]["violations"] == []
    assert codes[1] == 1
    first = documents[1]["violations"][0]
    assert first["kind"] == "version" and first["pytorch_raised"]
    assert same_file(first["culprit"]["user_frame"]["file"], script)
    assert first["culprit"]["user_frame"]["line"] == marker_line(script, "CULPRIT")
    assert first["victim"]["user_frame"]["line"] == marker_line(script, "VICTIM")
    assert len(documents[1]["violations"]) == 1, documents[1]["violations"][1:]


def test_fsdp2_optimizer_step_before_backward_is_reported_with_its_line(tmp_path):
    script, documents, codes = record_ranks(tmp_path, "fsdp.py", PROGRAM, "early_step")
    assert codes[1] == 1, documents[1]["warnings"]
    violations = documents[1]["violations"]
    assert violations, "the step between forward and backward went unreported"
    for v in violations:
        assert v["pytorch_raised"] is False
        assert v["culprit"]["op"] == "fsdp::split_with_sizes_copy", v["culprit"]
        source = v["changed_source"]
        assert source is not None and same_file(source["user_frame"]["file"], script)
        assert source["user_frame"]["line"] == marker_line(script, "EARLY_STEP")
    assert {v["victim"]["user_frame"]["line"] for v in violations} <= {
        marker_line(script, "WEIGHT_SAVED"), marker_line(script, "HEAD")}


def test_fsdp2_another_models_parameters_written_between_forward_and_backward_are_legal(tmp_path):
    # Plain parameters the all-gather does not read (an EMA model's, clamped): the refills still
    # put back what was saved.
    _, documents, codes = record_ranks(tmp_path, "fsdp.py", PROGRAM, "ema")
    for rank, document in documents.items():
        assert document["violations"] == [], (rank, document["violations"][:1])
        assert codes[rank] == 0, (rank, document["unexplained_errors"], document["warnings"])
        assert document["restored_writes"]["count"] >= 4, document["restored_writes"]["count"]
