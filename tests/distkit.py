"""How the tests' multi-process (gloo) child scripts end.

``leave_and_exit()`` is the last line of every child that joined a process group: wait for the
other ranks (so no rank leaves while another still writes or reads), leave the group, flush, and
end the process without interpreter teardown. With teardown, a gloo worker thread that frees a
tensor while the interpreter finalizes is killed mid-unwind and aborts the process (SIGABRT,
"terminate called without an active exception") after everything under test is done; CI saw it
twice in two different scripts. Children import this with the repository root on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import sys

import torch.distributed as dist


def leave_and_exit() -> None:
    """Barrier (with more than one rank), destroy the group, flush, ``os._exit(0)``."""
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
