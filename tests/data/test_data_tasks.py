"""Built-in tasks: deterministic splits and hand-worked reward values."""

import pytest

from data.tasks import EXACT_WEIGHT, compute_score, default_compute_score, make_splits, partial_score


def test_splits_are_deterministic_held_out_and_in_verl_layout():
    train, val = make_splits("reverse", 50, 10, seed=3)
    assert (train, val) == make_splits("reverse", 50, 10, seed=3)
    assert make_splits("reverse", 50, 10, seed=4)[0] != train
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}
    row = train[0]
    digits = row["prompt"][1:-1]
    assert row["data_source"] == "colorl/reverse" and row["prompt"] == f"r{digits}>"
    assert row["reward_model"]["ground_truth"] == digits[::-1]
    assert 3 <= len(digits) <= 5 and row["extra_info"]["split"] == "train"


def test_copy_task_answer_is_the_digits():
    row = make_splits("copy", 5, 1, seed=0)[0][0]
    assert row["prompt"] == f"c{row['reward_model']['ground_truth']}>"


@pytest.mark.parametrize(
    "solution, stopped, expected",
    [
        ("5746", True, 1.0),  # exact, stopped right after the answer
        ("5746", False, 4 / 5),  # all digits, but cut by the length limit
        ("5740", True, 4 / 5),  # one wrong digit, eos in place
        ("57", True, 2 / 5),  # stopped too early: no eos credit
        ("57461", True, 4 / 6),  # one extra character
        ("574612", False, 4 / 7),  # too long: extra characters count against it
        ("", True, 0.0),
    ],
)
def test_partial_score_hand_examples(solution, stopped, expected):
    assert partial_score(solution, "5746", stopped) == pytest.approx(expected)


def test_exact_weight_mixes_in_exact_match():
    assert partial_score("5740", "5746", True, exact_weight=0.5) == pytest.approx(0.5 * 4 / 5)
    assert partial_score("5746", "5746", True, exact_weight=0.5) == pytest.approx(1.0)


def test_compute_score_reads_the_stop_flag():
    w = EXACT_WEIGHT
    assert compute_score("colorl/reverse", "5746", "5746") == 1.0
    assert compute_score("colorl/reverse", "5746", "5746", {"stopped_by_eos": True}) == 1.0
    # cut by the length limit: no eos credit and not exact
    assert compute_score("colorl/reverse", "5746", "5746", {"stopped_by_eos": False}) == pytest.approx((1 - w) * 0.8)


def test_default_compute_score_names_unknown_source():
    assert default_compute_score("colorl/copy", "604", "604") == 1.0
    with pytest.raises(ValueError, match=r"nobody/knows.*colorl/copy.*colorl/reverse"):
        default_compute_score("nobody/knows", "1", "1")


def test_too_many_prompts_is_an_error():
    with pytest.raises(ValueError, match="only 1000"):
        make_splits("copy", 1000, 1, min_digits=3, max_digits=3)
