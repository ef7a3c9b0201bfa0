"""The HF Trainer's train() on a tiny torch module: gradient accumulation 2, no download, the CPU.

``python hf_train.py OUT [--own]``: OUT gets the losses the Trainer logged and the callbacks it
held; ``--own`` adds asyncthrottle's callback itself."""

import json
import sys
import tempfile

import torch
from torch import nn
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, x, labels=None):
        out = self.linear(x)
        # each micro-batch's forward: two a step
        if not torch.isfinite(out).all():  # host-device sync: Tensor.__bool__ 2.0
            raise RuntimeError("the model's output is not finite")
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class Records(TrainerCallback):
    """The losses the Trainer logs (one per optimizer step) and the callbacks it trains with."""

    def __init__(self):
        self.losses, self.callbacks, self.trainer = [], [], None

    def on_train_begin(self, args, state, control, **kwargs):
        self.callbacks = [type(c).__name__ for c in self.trainer.callback_handler.callbacks]

    def on_log(self, args, state, control, logs=None, **kwargs):
        if "loss" in logs:
            self.losses.append(logs["loss"])


torch.manual_seed(3)
data = [{"x": torch.randn(3), "labels": torch.randn(1)} for _ in range(16)]
records = Records()
callbacks = [records]
if "--own" in sys.argv:
    from asyncthrottle.transformers import ThrottleCallback

    callbacks.append(ThrottleCallback(depth=2))
with tempfile.TemporaryDirectory() as out:
    args = TrainingArguments(out, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             max_steps=4, learning_rate=0.1, logging_steps=1, save_strategy="no",
                             report_to=[], use_cpu=True, disable_tqdm=True, seed=3,
                             dataloader_num_workers=0)
    trainer = Trainer(Tiny(), args, train_dataset=data, callbacks=callbacks)
    # its end-of-train line holds the run time: not the same twice
    trainer.remove_callback(PrinterCallback)
    records.trainer = trainer
    trainer.train()
print("logged", len(records.losses), "losses")
with open(sys.argv[1], "w") as file:
    json.dump({"losses": records.losses, "callbacks": records.callbacks}, file)
