"""The default selection observes every parameter, also those held by a module with children.

``nn.MultiheadAttention`` holds ``in_proj_weight``/``in_proj_bias`` itself (its only child is
``out_proj``), and a ViT-style model holds its class token on the root: neither is a leaf, so a
leaf-only default silently left the attention input projection and the token out of the
gradient, parameter and update streams. The recorded rows are checked against the gradients the
optimizer consumed, captured by an independent pre-step hook.
"""

import pytest
import torch

from stepscope import open_run
from stepscope.collect import Cadence, HistoryCollector, WatchSettings


class TokenEncoder(torch.nn.Module):
    """A class token on the root, an encoder layer (MultiheadAttention inside), a head."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.cls = torch.nn.Parameter(torch.randn(1, 1, d) * 0.02)
        self.layer = torch.nn.TransformerEncoderLayer(d, 2, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        return self.head(self.layer(x)[:, 0])


def test_parameters_of_modules_with_children_have_rows_equal_to_the_consumed_gradients(tmp_path):
    torch.manual_seed(0)
    model = TokenEncoder()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    consumed: list[dict[str, torch.Tensor]] = []
    opt.register_step_pre_hook(
        lambda o, a, k: consumed.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        )
    )
    c = HistoryCollector(
        model,
        streams=["activation", "gradient", "parameter"],
        cadence=Cadence(1, 1),
        settings=WatchSettings(output_dir=str(tmp_path / "r")),
    )
    for _ in range(3):
        x, y = torch.randn(4, 5, 16), torch.randint(0, 3, (4,))
        with c.step(opt, examples=4):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    c.close()
    h = open_run(tmp_path / "r")
    names = {n for n, _ in model.named_parameters()}
    for name in ("cls", "layer.self_attn.in_proj_weight", "layer.self_attn.in_proj_bias"):
        assert name in names
        got = h.series(name, "gradient", "sum_squares").values
        want = [float(g[name].double().square().sum()) for g in consumed]
        assert got.tolist() == pytest.approx(want, rel=1e-12), name
        assert (
            h.series(name, "parameter", "total").values.tolist()
            == [float(dict(model.named_parameters())[name].numel())] * 3
        )
    # every parameter of the model has a gradient row, each parameter once
    for name in names:
        assert len(h.series(name, "gradient", "total").values) == 3, name
    # activation sites stay the leaves: MultiheadAttention (not a leaf) and the root have none
    leaves = {n for n, m in model.named_modules() if next(m.children(), None) is None}
    assert {r.site for r in c.rows if r.stream == "activation"} == leaves
    assert "layer.self_attn" not in leaves
