"""ColoRL entry point: ``python main.py [key=value ...]`` trains with PPO/GRPO (by default on the built-in demo).

The configuration is Hydra's: ``conf/ppo_trainer.yaml`` on top of the schema in ``trainer/config_schema.py``, e.g.
``python main.py data.train_batch_size=32 algorithm.adv_estimator=gae trainer.logger='[console,wandb]'``.
A config mistake prints one line (``colorl: config error: ...``) and exits with status 2.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, NoReturn

import hydra
from omegaconf import DictConfig

from trainer.config import ConfigError, load_config, num_workers, resolve_device, uses_critic, validate_config


def build_trainer(cfg: DictConfig) -> Any:
    """Validate ``cfg``, prepare model/data (the built-in demo when paths are null) and build the trainer."""
    # Deferred: these take seconds to import, and a config mistake should be reported at once.
    from transformers import AutoTokenizer

    from data.reward import RewardManager
    from trainer.ppo_trainer import RayPPOTrainer

    cfg.trainer.device = resolve_device(cfg)
    n_workers = num_workers(cfg)
    validate_config(cfg, n_workers)
    compute_score = _load_compute_score(cfg)
    _fill_paths(cfg)
    model = cfg.actor_rollout_ref.model
    _check_model("actor_rollout_ref.model.path", model.path, model.trust_remote_code, causal_lm=True)
    if uses_critic(cfg) and cfg.critic.model.path != model.path:
        _check_model("critic.model.path", cfg.critic.model.path, model.trust_remote_code, causal_lm=False)
    tokenizer = AutoTokenizer.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    train_dataloader, val_dataloader = _build_dataloaders(cfg, tokenizer)
    return RayPPOTrainer(
        config=cfg,
        tokenizer=tokenizer,
        train_dataloader=train_dataloader,
        val_dataloader=val_dataloader,
        reward_fn=RewardManager(tokenizer, compute_score=compute_score, reward_fn_key=cfg.data.reward_fn_key),
        val_reward_fn=RewardManager(tokenizer, compute_score=compute_score, reward_fn_key=cfg.data.reward_fn_key),
        n_workers=n_workers,
    )


def run_ppo(cfg: DictConfig) -> dict[str, float]:
    """Train from a composed config (Hydra's, or ``load_config``'s); returns the last step's metrics."""
    import ray

    from trainer.restarts import fit_with_restarts

    trainer = build_trainer(cfg)
    started_ray = _init_ray(cfg, trainer.n_workers)
    try:
        return fit_with_restarts(trainer, lambda: build_trainer(cfg), cfg.trainer.max_restarts)
    finally:
        if started_ray:
            ray.shutdown()


def _load_compute_score(cfg: DictConfig) -> Any:
    """The user's ``custom_reward_function.path/name``, or None for the built-in rewards (by data source)."""
    from data.reward import load_custom_compute_score

    custom = cfg.custom_reward_function
    if custom.path is None:
        return None
    try:
        return load_custom_compute_score(custom.path, custom.name)
    except FileNotFoundError:
        raise ConfigError.invalid("custom_reward_function.path", custom.path,
                                  "no such file; expected a Python file defining the reward function") from None
    except AttributeError as exc:
        raise ConfigError.invalid("custom_reward_function.name", custom.name, str(exc)) from None
    except Exception as exc:  # the user's module failed to import: report it as the config mistake it is
        first_line = (str(exc).splitlines() or [""])[0]
        raise ConfigError.invalid("custom_reward_function.path", custom.path,
                                  f"importing it raised {type(exc).__name__}: {first_line}") from None


def _fill_paths(cfg: DictConfig) -> None:
    """Point null model/data paths at the built-in demo assets (built once, then reused from the cache)."""
    from data.builtin import prepare_builtin

    model, data, builtin = cfg.actor_rollout_ref.model, cfg.data, cfg.builtin
    if model.path is None or data.train_files is None:
        assets = prepare_builtin(
            cache_dir=os.path.abspath(builtin.cache_dir),  # absolute: Ray workers load the model from it too
            task=builtin.task,
            num_train=builtin.num_train,
            num_val=builtin.num_val,
            sft_warmup_steps=builtin.sft_warmup_steps,
            hidden_size=builtin.hidden_size,
            num_layers=builtin.num_layers,
            seed=cfg.trainer.seed,
        )
        if model.path is None:
            model.path = assets["model_path"]
        if data.train_files is None:
            data.train_files = assets["train_files"]
            data.val_files = data.val_files or assets["val_files"]
    if cfg.critic.model.path is None:
        cfg.critic.model.path = model.path


def _check_model(key: str, path: str, trust_remote_code: bool, causal_lm: bool) -> None:
    """Fail before Ray starts when ``path`` is not a model directory (or, for the actor, not a causal LM)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if not os.path.isdir(path) and (os.path.isabs(path) or path.startswith(".") or path.count("/") != 1):
        raise ConfigError.invalid(key, path, "no such directory; expected a Hugging Face model directory "
                                  "(config.json, weights, tokenizer) or null for the built-in demo model")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise ConfigError.invalid(key, path, f"not a loadable model ({str(exc).splitlines()[0]})") from None
    auto_map = getattr(config, "auto_map", None) or {}
    is_causal_lm = config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or "AutoModelForCausalLM" in auto_map
    if causal_lm and not is_causal_lm:
        raise ConfigError.invalid(key, path, f"a {config.model_type!r} model is not a causal LM; the policy needs one "
                                  "that AutoModelForCausalLM loads (e.g. llama, qwen2, mistral, gpt2)")


def _build_dataloaders(cfg: DictConfig, tokenizer: Any) -> tuple[Any, Any]:
    """(train, val) loaders; val is None without data.val_files and holds the whole set when val_batch_size is null."""
    from data.dataset import RLHFDataset, make_dataloader

    data = cfg.data

    def dataset(key: str) -> RLHFDataset:
        files = data[key]
        try:
            return RLHFDataset(files, tokenizer, data.prompt_key, data.max_prompt_length, data.filter_overlong_prompts)
        except (FileNotFoundError, ValueError) as exc:  # a missing file or column, every prompt too long
            shown = files if isinstance(files, str) else list(files)
            raise ConfigError.invalid(f"data.{key}", shown, str(exc)) from None

    train = dataset("train_files")
    train_dataloader = make_dataloader(
        train, data.train_batch_size, shuffle=data.shuffle, seed=data.seed, drop_last=data.dataloader_drop_last
    )
    if len(train_dataloader) == 0:
        raise ConfigError(f"data.train_batch_size={data.train_batch_size}: larger than the {len(train)} training "
                          "prompts (with data.dataloader_drop_last=true no batch is left)")
    if data.val_files is None:
        return train_dataloader, None
    val = dataset("val_files")
    val_dataloader = make_dataloader(val, data.val_batch_size or len(val), shuffle=False, drop_last=False)
    return train_dataloader, val_dataloader


def _init_ray(cfg: DictConfig, n_workers: int) -> bool:
    """Start a local Ray cluster, or join ray_init.address / RAY_ADDRESS; False when Ray was already running."""
    import ray

    if ray.is_initialized():  # the caller (a test, a notebook) owns Ray and will shut it down
        return False
    address = cfg.ray_init.address or os.environ.get("RAY_ADDRESS")
    if address:
        _join_ray(address, "ray_init.address" if cfg.ray_init.address else "RAY_ADDRESS")
    else:
        # On CPU every worker holds one CPU slot, plus one for the driver's tasks; Ray counts the cores on GPU.
        cpu_default = n_workers + 1 if cfg.trainer.device == "cpu" else None
        ray.init(num_cpus=cfg.ray_init.num_cpus or cpu_default)
    return True


def _join_ray(address: str, key: str) -> None:
    """Attach to the running cluster at ``address``, failing in seconds with what to check."""
    import ray

    host, _, port = address.rpartition(":")
    if "://" not in address and port.isdigit():  # Ray itself retries an address where nothing listens for minutes
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise ConfigError(f"{key}={address!r}: no Ray cluster answers there ({exc}); start one with "
                              "`ray start --head` or fix the address") from None
    try:
        ray.init(address=address)  # an existing cluster brings its own resources
    except (ConnectionError, RuntimeError) as exc:
        raise ConfigError(
            f"{key}={address!r}: cannot join that Ray cluster ({str(exc).splitlines()[0]}). Clusters started by "
            "`ray start` check a token: set RAY_AUTH_MODE=token, with the head's ~/.ray/auth_token (or RAY_AUTH_TOKEN)"
        ) from None


def _exit_config_error(exc: ConfigError) -> NoReturn:
    print(f"colorl: config error: {exc}", file=sys.stderr)
    sys.exit(2)


def _check_overrides(args: list[str]) -> None:
    """Compose the command line once before Hydra does, so that an unknown key or a wrong type reads like every
    other config error instead of Hydra's own report. ``--config-name``/``-cn NAME`` picks the preset; Hydra's
    other flags (--help, --cfg, -m) are left to Hydra."""
    config_name, overrides = "ppo_trainer", []
    rest = iter(args)
    for arg in rest:
        if arg in ("--config-name", "-cn"):
            config_name = next(rest, config_name)
        elif arg.startswith("--config-name="):
            config_name = arg.partition("=")[2]
        else:
            overrides.append(arg)
    if any(arg.startswith("-") for arg in overrides):
        return
    try:
        load_config(overrides, config_name=config_name)
    except ConfigError as exc:
        _exit_config_error(exc)


@hydra.main(config_path="conf", config_name="ppo_trainer", version_base=None)
def main(cfg: DictConfig) -> None:
    from data.reward import RewardError  # deferred: these import Ray and torch
    from single_controller.ray.health import WorkerDiedError
    from trainer.checkpoint import CheckpointError
    from trainer.ppo_trainer import NonFiniteLossError
    from trainer.preemption import EXIT_PREEMPTED, Preempted

    try:
        run_ppo(cfg)
    except ConfigError as exc:
        _exit_config_error(exc)
    # the run is over and the workers are torn down: say what went wrong, not where the driver was
    except (WorkerDiedError, NonFiniteLossError, CheckpointError, RewardError) as exc:
        print(f"colorl: {exc}", file=sys.stderr)
        sys.exit(1)
    except Preempted as exc:  # SIGTERM/SIGINT: the step was finished and checkpointed
        print(f"colorl: {exc}", file=sys.stderr)
        sys.exit(EXIT_PREEMPTED)


if __name__ == "__main__":
    _check_overrides(sys.argv[1:])
    main()
