"""GSM8K reward: strict/flexible answer extraction, scores, and dispatch by data source."""

import pytest

from data.reward import RewardManager
from data.rewards.gsm8k import DATA_SOURCE, compute_score, extract_answer
from data.tasks import default_compute_score, reward_functions
from tests.data.gsm8k_fixture import printable_tokenizer, response_batch


@pytest.mark.parametrize(
    "text, strict, flexible",
    [
        ("3 + 4 = 7 apples.\n#### 7", "7", "7"),
        ("so #### 1,234 pens", "1234", "1234"),
        ("the cost is #### $18.", "18", "18"),
        ("####-5", "-5", "-5"),
        ("#### 1 then #### 2 and 3", "2", "3"),  # strict: the last ####; flexible: the last number
        ("The answer is 42.", None, "42"),
        ("lists 1,2,3 are not thousands", None, "3"),
        ("half is 2.5 cups", None, "2.5"),
        ("no digits at all", None, None),
    ],
)
def test_extraction(text, strict, flexible):
    assert extract_answer(text, "strict") == strict
    assert extract_answer(text, "flexible") == flexible


def test_scores_correct_wrong_and_missing():
    assert compute_score("#### 72", "72") == 1.0
    assert compute_score("#### 72.0", "72") == 1.0  # compared as numbers
    assert compute_score("#### 2,000", "2000") == 1.0
    assert compute_score("#### 71", "72", format_score=0.1) == 0.1  # formatted but wrong
    assert compute_score("it is 72", "72", format_score=0.1) == 0.0  # strict: no #### means no answer
    assert compute_score("it is 72", "72", method="flexible") == 1.0
    assert compute_score("#### 72", "72", score=2.0) == 2.0
    with pytest.raises(ValueError, match="loose"):
        compute_score("#### 72", "72", method="loose")


def test_default_dispatch_routes_gsm8k_and_the_builtin_tasks():
    assert {DATA_SOURCE, "colorl/copy", "colorl/reverse"} <= set(reward_functions())
    assert default_compute_score(DATA_SOURCE, "3 + 4 = 7 #### 7", "7") == 1.0
    assert default_compute_score(DATA_SOURCE, "7", "7") == 0.0  # the default is strict, as in verl
    assert default_compute_score("colorl/copy", "604", "604") == 1.0
    with pytest.raises(ValueError, match=r"nobody/knows.*openai/gsm8k"):
        default_compute_score("nobody/knows", "1", "1")


def test_reward_manager_scores_gsm8k_responses():
    tok = printable_tokenizer()
    texts = ["4 + 3 = 7 #### 7", "#### 8", "seven"]
    data = response_batch(tok, texts, DATA_SOURCE, "7")
    reward, extra = RewardManager(tok)(data)
    assert extra["score"] == [1.0, 0.0, 0.0]
    assert reward[0, len(texts[0])].item() == 1.0 and reward.sum().item() == 1.0  # on the eos token of row 0
