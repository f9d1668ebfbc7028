# EXPECT kind=version op=aten::mul_ node=SigmoidBackward0 saved=0 current=1 raised=1 victim_op=aten::sigmoid tags=dtensor
# DTensor (a one-process gloo mesh): an activation sigmoid saved is modified in place.
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

warnings.simplefilter("ignore")
store = tempfile.NamedTemporaryFile(delete=False)
dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
w = distribute_tensor(torch.randn(8, 8), mesh, [Shard(0)]).requires_grad_()
x = distribute_tensor(torch.randn(4, 8), mesh, [Shard(0)])
h = torch.sigmoid(x @ w)  # VICTIM
h.mul_(2)  # CULPRIT
h.sum().backward()
