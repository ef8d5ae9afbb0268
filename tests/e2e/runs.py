"""The e2e tests' run keys: the tiny GRPO run on CPU workers that several of them start from."""

from pathlib import Path


def run_keys(tmp_path: Path, steps: int) -> list[str]:
    """``steps`` steps on CPU, deterministic, no validation, a checkpoint every step, metrics in ``tmp_path``."""
    return [
        "trainer.device=cpu",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=1",
        "trainer.deterministic=true",
        f"trainer.default_local_dir={tmp_path}",
        "trainer.logger=[file]",
    ]
