"""Two-process HF Trainer under torchrun (gloo, CPU) with the stepscope callback.

``torchrun --nproc_per_node 2 this.py ROOT``: each rank writes ``ROOT/stepscope/rank<k>``.
"""

import os
import sys
from pathlib import Path

import torch.distributed as dist

import stepscope as ss
from stepscope.integrations.transformers import StepscopeCallback
from tests.integrations.test_transformers import train

if __name__ == "__main__":
    cb = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    train(Path(sys.argv[1]), [cb], epochs=1, ddp_backend="gloo")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: a gloo worker thread that frees a tensor while the interpreter
    # finalizes is killed mid-unwind and aborts the process (SIGABRT, "terminate called without
    # an active exception"), after training and every file written are done.
    os._exit(0)
