"""ColoRL entry point: ``python main.py [key=value ...]`` trains with PPO/GRPO (by default on the built-in demo).

The configuration is Hydra's: a preset in ``conf/`` on top of the schema in ``config/schema.py`` — the built-in
demo (``conf/demo.yaml``) unless the command line names a model or data, then verl's defaults
(``conf/ppo_trainer.yaml``), e.g.
``python main.py data.train_batch_size=32 algorithm.adv_estimator=gae trainer.logger='[console,wandb]'``.
A config mistake prints one line (``colorl: config error: ...``) and exits with status 2. Hydra's own flags
(``--help``, ``--cfg job``, ``-m``) and ``hydra.*`` keys are answered by Hydra's application.

Parse, build, train: the wiring lives in the package (``trainer/running/build.py``, ``trainer/running/run.py``).
"""

from __future__ import annotations

import logging
import os
import sys

import hydra
from omegaconf import DictConfig

from config import PPOConfig
from config.load import CONF_DIR
from verl_compat.cli import ConfigError, StepPlan, load_with_plan, make_plan, num_workers, split_command_line, to_config


def main(args: list[str]) -> int:
    """Compose the config once, check it, then build and train; returns the exit status."""
    # a user's tool file may import verl's module paths: where verl is not installed, the door serves them; the
    # command line is read as verl's (verl_compat.cli: its older spellings, the keys ColoRL warns about or refuses)
    os.environ.setdefault("COLORL_PRELOAD", "verl_compat.tools")
    config_name, overrides, hydra_app = split_command_line(args)
    if hydra_app:
        return _hydra_app(config_name, overrides)
    try:
        cfg, plan = load_with_plan(overrides, config_name)
    except ConfigError as exc:
        return _config_error(exc)
    # the console log Hydra's application would have set up (conf/ppo_trainer.yaml: hydra/job_logging=stdout)
    logging.basicConfig(
        stream=sys.stdout, level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
    )
    return _train(cfg, plan)


def _train(cfg: PPOConfig, plan: StepPlan) -> int:
    # deferred: torch, Ray and transformers take seconds to import, and a config mistake is reported before that;
    # a dry run reads only the models' configs, so it imports neither Ray nor the trainer
    if cfg.trainer.dry_run:
        from trainer.preflight.dry_run import dry_run as run
    else:
        from trainer.running.run import run_command_line as run
    try:
        return run(cfg, plan)
    except ConfigError as exc:  # found while building: a model or data path, a reward function
        return _config_error(exc)


def _config_error(exc: ConfigError) -> int:
    print(f"colorl: config error: {exc}", file=sys.stderr)
    return 2


def _hydra_app(config_name: str, args: list[str]) -> int:
    """Hydra's own command line (``--help``, ``--cfg job``, ``-m``, ``hydra.*``), with training as its task."""
    status = [0]

    def task(node: DictConfig) -> None:
        try:
            cfg = to_config(node)
            plan = make_plan(cfg, num_workers(cfg))
        except ConfigError as exc:
            status[0] = _config_error(exc)
            return
        status[0] = _train(cfg, plan)

    sys.argv[1:] = [f"--config-name={config_name}", *args]
    hydra.main(config_path=str(CONF_DIR), config_name=config_name, version_base=None)(task)()
    return status[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
