"""Small shared pieces of the optimizer/closure/resume tests: settings, loss, seeded batches."""

from __future__ import annotations

import torch

import stepscope as ss

LENGTHS = (5, 9, 7, 12, 6, 10, 8)


def disk_settings(tmp_path, name: str = "run", **fields) -> ss.WatchSettings:
    """A throwaway artifact that commits every step (so a reader sees all of them)."""
    return ss.WatchSettings(
        output_dir=str(tmp_path / name), durable=False, commit_steps=1, **fields
    )


def ce(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last dimension (token or image logits)."""
    return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def images(n: int, seed: int = 4) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` seeded batches for :class:`models.ResNetish` (4 images, 5 classes)."""
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g))
        for _ in range(n)
    ]


def tokens(n: int, vocab: int = 40, seed: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` seeded token batches of varying length for :class:`models.TinyGPT`."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = LENGTHS[i % len(LENGTHS)]
        out.append(
            (
                torch.randint(0, vocab, (3, t), generator=g),
                torch.randint(0, vocab, (3, t), generator=g),
            )
        )
    return out
