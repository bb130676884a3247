"""Two-process Lightning DDP on gloo (CPU) with the stepscope callback: ``python this.py ROOT``.

Lightning's DDP launcher re-runs this script for rank 1; each rank writes ``ROOT/stepscope/version_0/rank<k>``.
"""

import sys

import lightning.pytorch as pl
import torch

import stepscope as ss
from stepscope.integrations.lightning import StepscopeCallback
from tests.distkit import leave_and_exit
from tests.integrations.test_lightning import TinyCNN, loaders

if __name__ == "__main__":
    torch.manual_seed(0)
    trainer = pl.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=sys.argv[1],
        callbacks=[StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))],
    )
    train, val = loaders()
    trainer.fit(TinyCNN(), train, val)
    leave_and_exit()  # both ranks are done (and their collectors closed) past here
