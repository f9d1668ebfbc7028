"""A trainer on a tiny regression model, on the CPU, 2 batches per optimizer step, with torchrr's
step callback or without:

    python trainer_steps.py transformers OUTPUT_DIR callback|none      # 4 optimizer steps
    python trainer_steps.py lightning OUTPUT_DIR callback|none BATCHES EPOCHS

(Lightning: BATCHES batches an epoch; with an odd number, each epoch ends on a shorter step.)
Prints ``optimizer steps N``, the trainer's own count, at the end.
"""
import sys

import torch
from torch import nn


def regression_loss(linear, x, y):
    return ((linear(x).squeeze(-1) - y) ** 2).mean()


def transformers_steps(output_dir, mode):
    from transformers import Trainer, TrainingArguments

    from torchrr.callbacks import TrainerStepCallback

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def forward(self, x, labels):
            return {"loss": regression_loss(self.linear, x, labels)}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 32

        def __getitem__(self, i):
            x = torch.randn(4, generator=torch.Generator().manual_seed(i))
            return {"x": x, "labels": x.sum()}

    args = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=2,
                             gradient_accumulation_steps=2, max_steps=4, report_to="none",
                             save_strategy="no", logging_strategy="no", use_cpu=True,
                             disable_tqdm=True, dataloader_num_workers=0)
    callbacks = [TrainerStepCallback()] if mode == "callback" else []
    trainer = Trainer(model=Tiny(), args=args, train_dataset=Data(), callbacks=callbacks)
    trainer.train()
    return trainer.state.global_step


def lightning_steps(output_dir, mode, batches, epochs):
    import lightning

    from torchrr.callbacks import LightningStepCallback

    class Tiny(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return regression_loss(self.linear, *batch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(2 * int(batches), 4)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(-1)), batch_size=2)
    callbacks = [LightningStepCallback()] if mode == "callback" else []
    trainer = lightning.Trainer(default_root_dir=output_dir, accelerator="cpu", devices=1,
                                max_epochs=int(epochs), accumulate_grad_batches=2, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False,
                                enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Tiny(), data)
    return trainer.global_step


if __name__ == "__main__":
    torch.manual_seed(0)
    run = {"transformers": transformers_steps, "lightning": lightning_steps}[sys.argv[1]]
    print("optimizer steps", run(*sys.argv[2:]))
