"""A fixed training loop for whole-process timings: the quiet-step benchmark's 8x16 MLP.

Run:  .venv/bin/python benchmarks/quiet_loop.py on|off STEPS

``on`` trains STEPS steps inside ``with collector.step(opt):`` (default settings, cadence and
streams, an artifact in a temporary folder), ``off`` the same loop unobserved. Time whole
processes from outside (``/usr/bin/time -v``, user + system seconds), alternating the two
commands or two checkouts (``PYTHONPATH=<checkout>/src``) run by run, so that the machine's
drift hits both: the difference per step is everything the collector costs, both threads,
quiet and due steps, its start and its close.
"""

from __future__ import annotations

import sys
import tempfile

import torch
from torch import nn

import stepscope as ss


def main(argv: list[str]) -> int:
    mode, steps = argv[0], int(argv[1])
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(8) for m in (nn.Linear(16, 16), nn.ReLU())])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(4, 16), torch.randint(0, 16, (4,))
    c = None
    if mode == "on":
        c = ss.HistoryCollector(model, settings=ss.WatchSettings(output_dir=tempfile.mkdtemp()))
    for _ in range(steps):
        if c is None:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            continue
        with c.step(opt, examples=4):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    if c is not None:
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
