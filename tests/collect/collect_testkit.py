"""Tiny models and data for collector tests."""

import torch


class SmallNet(torch.nn.Module):
    """Linear, Conv2d, BatchNorm (train mode) and Dropout: everything purity must survive."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.drop = torch.nn.Dropout(0.3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(self.drop(h).flatten(1))


def batches(n: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 10, (8,), generator=g))
        for _ in range(n)
    ]
