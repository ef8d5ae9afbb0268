"""``main.py`` whose in-process worker (``trainer.use_ray=false``) gets stuck in C code, for the stop tests (run as
a script, in its own process).

    python tests/reliability/stuck_run.py CALL [key=value ...]

On its CALL-th call, the worker's ``update_actor`` blocks the driver's main thread in C for good (a mutex locked
twice: no signal interrupts it, so no Python signal handler ever runs there), after writing ``stuck`` to
``<trainer.default_local_dir>/stuck``. Everything else is the ordinary ``python main.py key=value ...``.
"""

import ctypes
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from trainer.running.ppo_trainer import RayPPOTrainer  # noqa: E402


def stuck_in_c(marker: Path) -> None:
    libc = ctypes.CDLL(None)  # CDLL: the call releases the GIL, as a collective in C++ does
    mutex = ctypes.create_string_buffer(64)  # glibc's PTHREAD_MUTEX_INITIALIZER is all zeros
    libc.pthread_mutex_lock(mutex)
    marker.write_text("stuck")
    libc.pthread_mutex_lock(mutex)  # a normal mutex locked twice by its holder: waits forever, EINTR or not


def run(on_call: int, overrides: list[str]) -> None:
    init_workers = RayPPOTrainer.init_workers

    def init_workers_stuck(self: RayPPOTrainer) -> None:
        init_workers(self)
        role = self.fused_wg.workers[0].worker_dict["actor_rollout"]
        original, calls = role.update_actor, [0]

        def update_actor(data):
            calls[0] += 1
            if calls[0] == on_call:
                stuck_in_c(Path(self.config.trainer.default_local_dir) / "stuck")
            return original(data)

        role.update_actor = update_actor

    RayPPOTrainer.init_workers = init_workers_stuck
    sys.argv = [str(REPO / "main.py"), *overrides]
    runpy.run_path(sys.argv[0], run_name="__main__")  # as `python main.py`: Hydra finds conf/ beside it


if __name__ == "__main__":
    run(int(sys.argv[1]), sys.argv[2:])
