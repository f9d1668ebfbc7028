# EXPECT violations=0 exit=0 tags=subclass,dtensor
# Legal with tensor subclasses: a wrapper subclass (TwoTensor) and DTensor (a one-process gloo
# mesh) through forward and backward, the whole run recorded.
import tempfile
import warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.testing._internal.two_tensor import TwoTensor

warnings.simplefilter("ignore")
a = TwoTensor(torch.randn(4, 4), torch.randn(4, 4)).requires_grad_()
(a.sin() * 2).sum().backward()

store = tempfile.NamedTemporaryFile(delete=False)
dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
w = distribute_tensor(torch.randn(8, 8), mesh, [Shard(0)]).requires_grad_()
x = distribute_tensor(torch.randn(4, 8), mesh, [Shard(0)])
torch.sigmoid(x @ w).sum().backward()
dist.destroy_process_group()
