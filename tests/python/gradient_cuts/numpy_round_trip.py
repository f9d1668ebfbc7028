# EXPECT cause=numpy raised=1
# A NumPy round trip in the loss: what comes back from NumPy is a new tensor with no history.
import torch

torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
x = torch.randn(4, 8)
probs = model(x).softmax(-1).detach().numpy()  # CUT
loss = -torch.from_numpy(probs).log().mean()
loss.backward()
