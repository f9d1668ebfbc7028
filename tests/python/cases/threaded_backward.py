# EXPECT violations=0 exit=0 passes=200
# Legal: four threads, each running 50 forward and backward passes over graphs of its own at the
# same time: 200 backward passes, whatever the interleaving.
import threading

import torch


def train():
    for _ in range(50):
        x = torch.randn(8, requires_grad=True)
        y = torch.sigmoid(x * 2)
        y.sum().backward()


threads = [threading.Thread(target=train) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
