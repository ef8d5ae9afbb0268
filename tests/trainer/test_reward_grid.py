"""The end-of-run plot: a 2 × 2 grid of reward and validation, response length, entropy and KL, all-equal groups."""

import math

import numpy as np
from PIL import Image

from trainer.observing.tracking import PANELS, plot_reward_curve


def _records(with_groups: bool) -> list[dict]:
    records = []
    for step in range(0, 41):
        record = {"step": step}
        if step:
            record |= {
                "critic/score/mean": step / 40,
                "response_length/mean": 10 + step / 4,
                "response_length/clip_ratio": step / 80,
                "actor/entropy": math.exp(-step / 10),
                "actor/kl_loss": step / 1000,
                "health/warning/entropy_collapse": float(step > 30),
            }
            if with_groups:
                record["health/frac_reward_zero_std"] = 1 - step / 50
        if step % 10 == 0:
            record |= {
                "val-core/colorl/arith/reward/mean@1": 0.3 + step / 100,
                "val-aux/colorl/arith/flexible/mean@1": 0.4 + step / 200,
            }
        records.append(record)
    return records


def _coloured_pixels(image: np.ndarray) -> list[int]:
    """Pixels of a clearly coloured (not grey) hue in each quadrant: top-left, top-right, bottom-left, bottom-right."""
    rgb = image[..., :3].astype(int)
    coloured = (rgb.max(-1) - rgb.min(-1)) > 80
    h, w = coloured.shape
    return [
        int(coloured[rows, cols].sum())
        for rows in (slice(0, h // 2), slice(h // 2, h))
        for cols in (slice(0, w // 2), slice(w // 2, w))
    ]


def test_the_plot_is_a_grid_of_four_panels_with_their_curves(tmp_path):
    path = tmp_path / "reward_curve.png"
    assert plot_reward_curve(_records(with_groups=True), path)
    with Image.open(path) as png:
        assert png.size == (1100, 700)
        assert (
            png.text["Title"].split(" | ")
            == [panel.title for panel in PANELS]
            == ["reward and validation", "response length", "entropy and KL", "prompt groups with all-equal rewards"]
        )
        pixels = np.asarray(png.convert("RGB"))
    assert all(count > 200 for count in _coloured_pixels(pixels))  # every panel drew its curves


def test_a_signal_never_logged_leaves_its_panel_empty(tmp_path):
    path = tmp_path / "reward_curve.png"
    assert plot_reward_curve(_records(with_groups=False), path)  # n = 1: no prompt groups
    with Image.open(path) as png:
        top_left, top_right, bottom_left, bottom_right = _coloured_pixels(np.asarray(png.convert("RGB")))
    assert min(top_left, top_right, bottom_left) > 200 and bottom_right == 0
