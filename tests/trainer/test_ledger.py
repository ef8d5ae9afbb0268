"""The run's ledger of what was trained (trainer/state/ledger.py), as bookkeeping: steps recorded, checked on resume
against a checkpoint's digests, the data position and the batches in flight."""

import json

import numpy as np
import pytest
import torch

from data.dataset import INDEX
from single_controller.data_proto import DataProto
from trainer.state.data_position import EPOCH
from trainer.state.ledger import FILE, Ledger, LedgerError


def batch(epoch: int, *indices: int, n: int = 2) -> DataProto:
    """The rows of ``indices`` (each prompt ``n`` times, as ``rollout.n`` repeats it), drawn in ``epoch``."""
    rows = np.repeat(np.array(indices, dtype=np.int64), n)
    columns = {INDEX: rows, EPOCH: np.full(len(rows), epoch, dtype=np.int64)}
    return DataProto.from_dict({"x": torch.zeros(len(rows))}, columns)


def step(ledger: Ledger, number: int, drawn: DataProto, **outcomes: DataProto) -> None:
    ledger.record("drawn", drawn)
    for kind, rows in outcomes.items():
        ledger.record(kind, rows)
    ledger.end_step(number)


def two_epochs(tmp_path) -> Ledger:
    """4 prompts an epoch, 2 a step: epoch 0 in steps 1-2 (prompt 3 filtered), epoch 1 begun at step 3."""
    ledger = Ledger(tmp_path, epoch_size=4)
    step(ledger, 1, batch(0, 2, 0), trained=batch(0, 2, 0), failed=batch(0, 0, n=1))
    step(ledger, 2, batch(0, 3, 1), trained=batch(0, 1), filtered=batch(0, 3))
    step(ledger, 3, batch(1, 1, 2), trained=batch(1, 1, 2))
    return ledger


def test_each_step_is_a_line_and_each_epoch_a_tally(tmp_path):
    ledger = two_epochs(tmp_path)
    lines = [json.loads(line) for line in (tmp_path / FILE).read_text().splitlines()]
    assert [(line["step"], line["epoch"]) for line in lines] == [(1, 0), (2, 0), (3, 1)]
    assert lines[1] == {"step": 2, "epoch": 0, "drawn": [3, 1], "trained": [1], "filtered": [3], "dropped": [],
                        "failed": []}  # fmt: skip
    assert ledger.summary() == [
        "epoch 0: trained 3 of 4, filtered 1, dropped 0, failed 1",
        "epoch 1: trained 2 of 4, filtered 0, dropped 0 (2 not drawn yet)",
    ]


def test_a_prompt_ending_twice_in_an_epoch_is_an_error_naming_it(tmp_path):
    ledger = two_epochs(tmp_path)
    ledger.record("dropped", batch(1, 2))
    with pytest.raises(LedgerError, match="prompt 2 of epoch 1 dropped at step 4, but already trained at step 3"):
        ledger.end_step(4)
    ledger.record("drawn", batch(1, 1))
    with pytest.raises(LedgerError, match="prompt 1 of epoch 1 drawn again at step 5 .first at step 3."):
        ledger.end_step(5)


def resumed(tmp_path, state, step: int, drawn=(1, [1, 2]), in_flight=()) -> Ledger:
    ledger = Ledger(tmp_path, epoch_size=4)
    ledger.resume(state, tmp_path / f"global_step_{step}", step, drawn, list(in_flight))
    return ledger


def test_a_resume_drops_the_later_steps_and_goes_on_counting(tmp_path):
    ledger = Ledger(tmp_path, epoch_size=4)
    step(ledger, 1, batch(0, 2, 0), trained=batch(0, 2, 0))
    state = ledger.state()  # the checkpoint of step 1
    step(ledger, 2, batch(0, 3, 1), trained=batch(0, 3, 1))
    again = resumed(tmp_path, state, 1, drawn=(0, [2, 0]))
    assert len((tmp_path / FILE).read_text().splitlines()) == 1  # step 2 is computed again
    step(again, 2, batch(0, 3, 1), trained=batch(0, 3, 1))
    assert again.summary() == ["epoch 0: trained 4 of 4, filtered 0, dropped 0"]
    assert again.state() == ledger.state()


def test_an_edited_ledger_is_refused_naming_the_file_and_line(tmp_path):
    state = two_epochs(tmp_path).state()
    path = tmp_path / FILE
    lines = path.read_text().splitlines()
    path.write_text("\n".join([lines[0], lines[1].replace("[3, 1]", "[3, 5]"), lines[2]]) + "\n")
    with pytest.raises(LedgerError) as error:
        resumed(tmp_path, state, 3)
    assert str(error.value).startswith(f"{path} line 2 does not match checkpoint {tmp_path / 'global_step_3'}")
    path.write_text(lines[0] + "\n")
    with pytest.raises(LedgerError, match=f"{path} holds 1 line.s., checkpoint .* recorded 3 up to step 3"):
        resumed(tmp_path, state, 3)
    path.write_text("\n".join([*lines, lines[2]]) + "\n")  # a line of step 3 that the checkpoint does not record
    with pytest.raises(LedgerError, match=f"{path} line 4 is of step 3"):
        resumed(tmp_path, state, 3)


def test_a_resume_whose_data_position_differs_names_the_prompt_trained_twice_or_skipped(tmp_path):
    state = two_epochs(tmp_path).state()
    resumed(tmp_path, state, 3, drawn=(1, [2, 1]))  # the same prompts: fine
    with pytest.raises(LedgerError, match="prompt 2 of epoch 1 was drawn at step 3, .* would train it twice"):
        resumed(tmp_path, state, 3, drawn=(1, [1, 3]))
    with pytest.raises(LedgerError, match="prompt 0 of epoch 1 was drawn before the checkpoint, .* would skip it"):
        resumed(tmp_path, state, 3, drawn=(1, [1, 2, 0, 3]))


def test_prompts_in_flight_are_those_of_the_checkpoints_queue(tmp_path):
    ledger = Ledger(tmp_path, epoch_size=4)
    step(ledger, 1, batch(0, 0, 1), trained=batch(0, 0))  # prompt 1 generated ahead, not trained yet
    state = ledger.state()
    resumed(tmp_path, state, 1, drawn=(0, [0, 1]), in_flight=[batch(0, 1)])
    with pytest.raises(LedgerError, match="prompt 1 of epoch 0, drawn at step 1, is neither .* would skip it"):
        resumed(tmp_path, state, 1, drawn=(0, [0, 1]))
    with pytest.raises(LedgerError, match="queue holds prompt 0 of epoch 0, which was trained at step 1"):
        resumed(tmp_path, state, 1, drawn=(0, [0, 1]), in_flight=[batch(0, 1), batch(0, 0)])


def test_a_checkpoint_without_a_ledger_counts_from_its_step(tmp_path):
    ledger = resumed(tmp_path, None, 4, drawn=(1, [3, 0]))
    step(ledger, 5, batch(1, 1, 2), trained=batch(1, 1, 2, 3))  # 3 was drawn before the checkpoint
    assert ledger.summary() == [
        "epoch 1: trained 3 of 4, filtered 0, dropped 0 (1 not drawn yet)",  # 3 (before), 1 and 2: 0 is not known
        "(counted from step 4: no ledger before the checkpoint resumed from)",
    ]


def test_a_checkpoint_copied_without_its_ledger_counts_from_its_step(tmp_path, capsys):
    """A checkpoint copied into another directory without ledger.jsonl: one warning, counted from its step (a file
    that is there but cut is refused: the edited-ledger test)."""
    state = two_epochs(tmp_path / "first").state()
    ledger = resumed(tmp_path, state, 3, drawn=(1, [1, 2]))
    assert f"no {FILE} in {tmp_path} beside checkpoint" in capsys.readouterr().err
    step(ledger, 4, batch(1, 0, 3), trained=batch(1, 0, 3))
    assert ledger.summary()[0] == "epoch 1: trained 2 of 4, filtered 0, dropped 0 (2 not drawn yet)"
