"""``main.py`` SIGKILLed, its whole process group, once step STEP is over and its ledger line written (before that
step's checkpoint), for the ledger tests (run as a script, in its own process group):

    python tests/reliability/kill_run.py STEP [key=value ...]

Everything else is the ordinary ``python main.py key=value ...``.
"""

import os
import runpy
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from trainer.state.ledger import Ledger  # noqa: E402


def run(kill_at: int, overrides: list[str]) -> None:
    end_step = Ledger.end_step

    def end_step_then_die(self: Ledger, step: int) -> None:
        end_step(self, step)
        if step == kill_at:  # no save, no teardown: as a power cut or the OOM killer leaves a run
            os.killpg(os.getpgid(0), signal.SIGKILL)

    Ledger.end_step = end_step_then_die
    sys.argv = [str(REPO / "main.py"), *overrides]
    runpy.run_path(sys.argv[0], run_name="__main__")  # as `python main.py`: Hydra finds conf/ beside it


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2:])
