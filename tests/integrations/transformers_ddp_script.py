"""Two-process HF Trainer under torchrun (gloo, CPU) with the stepscope callback.

``torchrun --nproc_per_node 2 this.py ROOT``: each rank writes ``ROOT/stepscope/version_0/rank<k>``.
"""

import sys
from pathlib import Path

import stepscope as ss
from stepscope.integrations.transformers import StepscopeCallback
from tests.distkit import leave_and_exit
from tests.integrations.test_transformers import train

if __name__ == "__main__":
    cb = StepscopeCallback(cadence=1, settings=ss.WatchSettings(durable=False))
    train(Path(sys.argv[1]), [cb], epochs=1, ddp_backend="gloo")
    leave_and_exit()
