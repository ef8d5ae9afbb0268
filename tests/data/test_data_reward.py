"""RewardManager and custom reward loading."""

import pytest
import torch

from data.reward import RewardManager, load_custom_compute_score
from data.tasks import EXACT_WEIGHT
from single_controller import DataProto


def _batch(tok, responses, ground_truths, source="colorl/reverse", width=6):
    """Right-padded response ids with response_mask covering the generated tokens (eos included)."""
    ids = torch.full((len(responses), width), tok.pad_token_id)
    mask = torch.zeros((len(responses), width), dtype=torch.long)
    for i, text in enumerate(responses):
        row = [tok.eos_token_id if t == "$" else tok.convert_tokens_to_ids(t) for t in text]
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    n = len(responses)
    return DataProto.from_dict(
        {"responses": ids, "response_mask": mask},
        {
            "data_source": [source] * n,
            "reward_model": [{"ground_truth": g} for g in ground_truths],
            "extra_info": [{"index": i} for i in range(n)],
        },
    )


def test_score_sits_on_the_last_valid_token(char_tokenizer):
    # "$" stands for the eos token; row 2 hits the length limit without eos.
    data = _batch(char_tokenizer, ["5746$", "57$", "574612"], ["5746", "5746", "5746"])
    reward, extra = RewardManager(char_tokenizer)(data)
    partial = 1 - EXACT_WEIGHT  # neither row 1 nor row 2 is exact, so they get the partial share only
    assert reward.shape == (3, 6) and reward.dtype == torch.float32
    assert reward[0].tolist() == pytest.approx([0, 0, 0, 0, 1.0, 0])
    assert reward[1].tolist() == pytest.approx([0, 0, partial * 2 / 5, 0, 0, 0])
    assert reward[2].tolist() == pytest.approx([0, 0, 0, 0, 0, partial * 4 / 7])
    assert extra["score"] == pytest.approx([1.0, partial * 2 / 5, partial * 4 / 7])


def test_custom_score_gets_decoded_text_and_stop_flag(char_tokenizer):
    seen = []

    def score(data_source, solution_str, ground_truth, extra_info=None):
        seen.append((data_source, solution_str, ground_truth, extra_info["stopped_by_eos"], extra_info["index"]))
        return {"score": float(solution_str == ground_truth), "length": len(solution_str)}

    data = _batch(char_tokenizer, ["12$", "1234"], ["12", "12"], source="mine")
    reward, extra = RewardManager(char_tokenizer, compute_score=score)(data)
    assert seen == [("mine", "12", "12", True, 0), ("mine", "1234", "12", False, 1)]
    assert reward.sum().item() == 1.0 and reward[0, 2].item() == 1.0
    assert extra == {"score": [1.0, 0.0], "length": [2, 4]}


def test_unknown_data_source_fails_clearly(char_tokenizer):
    with pytest.raises(ValueError, match="nobody/knows"):
        RewardManager(char_tokenizer)(_batch(char_tokenizer, ["1$"], ["1"], source="nobody/knows"))


def test_load_custom_compute_score(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text("def my_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n")
    assert load_custom_compute_score(str(path), "my_score")("x", "a", "b") == 0.5
    with pytest.raises(AttributeError, match=r"my_reward\.py.*'compute_score'.*my_score"):
        load_custom_compute_score(str(path), "compute_score")
    with pytest.raises(FileNotFoundError, match=r"missing\.py.*'my_score'"):
        load_custom_compute_score(str(tmp_path / "missing.py"), "my_score")
