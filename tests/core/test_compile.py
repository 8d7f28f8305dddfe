"""torch.compile sees the ROPIM training forward as one graph: the corruption is drawn by the caller (outside the
compiled region), and the sketch, mask and loss are plain tensor code (no graph break)."""

from __future__ import annotations

import pytest
import torch
from support import TINY_MODEL, gen, make_model


@pytest.mark.parametrize("backbone,corruption", [("beit", "rop"), ("vit", "rop"), ("beit", "mask")])
def test_forward_with_a_drawn_corruption_has_no_graph_break(backbone, corruption):
    model = make_model(TINY_MODEL, backbone=backbone, corruption=corruption).train()
    imgs = torch.randn(2, 3, 32, 32, generator=gen(1))
    c = model.draw_corruption(2, gen(2))
    torch._dynamo.reset()
    try:
        explained = torch._dynamo.explain(model)(imgs, corruption=c)
    finally:
        torch._dynamo.reset()
    reasons = [r.reason.splitlines()[0] for r in explained.break_reasons]
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), reasons
    eager_loss, _, _ = model(imgs, corruption=c)
    assert torch.isfinite(eager_loss)


def test_a_drawn_corruption_gives_the_loss_of_forward_drawing_it():
    model = make_model(TINY_MODEL)
    imgs = torch.randn(2, 3, 32, 32, generator=gen(1))
    drawn, _, _ = model(imgs, gen(5))
    given, _, _ = model(imgs, corruption=model.draw_corruption(2, gen(5)))
    assert torch.equal(drawn, given)
