"""ColoRL entry point: ``python main.py [key=value ...]`` trains with PPO/GRPO (by default on the built-in demo).

The configuration is Hydra's: a preset in ``conf/`` on top of the schema in ``config/schema.py`` — the built-in
demo (``conf/demo.yaml``) unless the command line names a model or data, then verl's defaults
(``conf/ppo_trainer.yaml``), e.g.
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

from config import ConfigError, PPOConfig, load_config, make_plan, num_workers, replace_keys, resolve_device, to_config
from config.load import preset_for
from config.verl import ignored_key_warnings, rewrite_aliases


def build_trainer(cfg: PPOConfig) -> Any:
    """Check ``cfg``, prepare model/data (the built-in demo when paths are null) and build the trainer."""
    # Deferred: these take seconds to import, and a config mistake should be reported at once.
    from transformers import AutoTokenizer

    from data.builtin import demo_model_config
    from data.reward import RewardManager
    from trainer.dry_run import preflight
    from trainer.ppo_trainer import RayPPOTrainer

    plan = make_plan(cfg, num_workers(cfg))
    preflight(cfg, plan, lambda: demo_model_config(cfg.builtin))  # trainer.dry_run; the memory check
    cfg = replace_keys(cfg, {"trainer.device": resolve_device(cfg)})
    for line in ignored_key_warnings(cfg):  # verl keys of machinery ColoRL does not have
        print(f"colorl: warning: {line}", file=sys.stderr)
    compute_score = _load_compute_score(cfg)
    cfg = _fill_paths(cfg)
    model, critic_model = cfg.actor_rollout_ref.model, cfg.critic.model
    _check_model("actor_rollout_ref.model.path", model.path, model.trust_remote_code, causal_lm=True)
    if plan.use_critic and critic_model.path != model.path:
        _check_model("critic.model.path", critic_model.path, critic_model.trust_remote_code, causal_lm=False)
    tokenizer = AutoTokenizer.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    train_dataloader, val_dataloader = _build_dataloaders(cfg, tokenizer)
    return RayPPOTrainer(
        config=cfg,
        tokenizer=tokenizer,
        train_dataloader=train_dataloader,
        val_dataloader=val_dataloader,
        reward_fn=RewardManager(tokenizer, compute_score=compute_score, reward_fn_key=cfg.data.reward_fn_key),
        val_reward_fn=RewardManager(tokenizer, compute_score=compute_score, reward_fn_key=cfg.data.reward_fn_key),
        plan=plan,
    )


def run_ppo(cfg: PPOConfig) -> dict[str, float]:
    """Train from a typed config (``load_config``'s, or Hydra's through ``to_config``); returns the last step's
    metrics. A restart after a dead worker resumes from this run's own latest checkpoint (resume_mode=auto)."""
    import ray

    from trainer.restarts import fit_with_restarts

    trainer = build_trainer(cfg)
    started_ray = _init_ray(trainer.config, trainer.plan.n_workers)
    resuming = replace_keys(cfg, {"trainer.resume_mode": "auto"})
    try:
        return fit_with_restarts(trainer, lambda: build_trainer(resuming), cfg.trainer.max_restarts)
    finally:
        if started_ray:
            ray.shutdown()


def _load_compute_score(cfg: PPOConfig) -> Any:
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


def _fill_paths(cfg: PPOConfig) -> PPOConfig:
    """``cfg`` with null model/data paths pointing at the built-in demo assets (built once, then reused from the
    cache), a null critic path at the actor's model, and the output directory absolute, since every worker writes
    checkpoint shards there from its own working directory (on another node, or under ``ray job submit`` a
    per-node copy of the job's)."""
    from data.builtin import prepare_builtin

    model, data, builtin = cfg.actor_rollout_ref.model, cfg.data, cfg.builtin
    paths: dict[str, Any] = {"trainer.default_local_dir": os.path.abspath(cfg.trainer.default_local_dir)}
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
            paths["actor_rollout_ref.model.path"] = assets["model_path"]
        if data.train_files is None:
            paths["data.train_files"] = assets["train_files"]
            paths["data.val_files"] = data.val_files or assets["val_files"]
    model_path = paths.get("actor_rollout_ref.model.path", model.path)
    if cfg.critic.model.path is None:
        paths["critic.model.path"] = model_path
    return replace_keys(cfg, paths)


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


def _build_dataloaders(cfg: PPOConfig, tokenizer: Any) -> tuple[Any, Any]:
    """(train, val) loaders; val is None without data.val_files and holds the whole set when val_batch_size is null."""
    from data.dataset import RLHFDataset, make_dataloader

    data = cfg.data

    def dataset(key: str, max_samples: int) -> RLHFDataset:
        files = getattr(data, key)
        try:
            return RLHFDataset(files, tokenizer, data.prompt_key, data.max_prompt_length, data.filter_overlong_prompts,
                               data.truncation, max_samples)
        except (FileNotFoundError, ValueError) as exc:  # a missing file or column, every prompt too long
            shown = files if isinstance(files, str) else list(files)
            raise ConfigError.invalid(f"data.{key}", shown, str(exc)) from None

    train = dataset("train_files", data.train_max_samples)
    train_dataloader = make_dataloader(
        train, data.train_batch_size, shuffle=data.shuffle, seed=data.seed, drop_last=data.dataloader_drop_last
    )
    if len(train_dataloader) == 0:
        raise ConfigError(f"data.train_batch_size={data.train_batch_size}: larger than the {len(train)} training "
                          "prompts (with data.dataloader_drop_last=true no batch is left)")
    if data.val_files is None:
        return train_dataloader, None
    val = dataset("val_files", data.val_max_samples)
    val_dataloader = make_dataloader(val, data.val_batch_size or len(val), shuffle=False, drop_last=False)
    return train_dataloader, val_dataloader


def _init_ray(cfg: PPOConfig, n_workers: int) -> bool:
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


def _prepare_command_line(args: list[str]) -> list[str]:
    """The arguments Hydra gets: the preset named (``--config-name``/``-cn``, else ``preset_for`` the overrides:
    the demo, or verl's defaults once a model or data is named) and verl's key paths moved to ColoRL's.

    The command line is composed once here, before Hydra does, so that an unknown key or a wrong type reads like
    every other config error instead of Hydra's own report; Hydra's other flags (--help, --cfg, -m) skip that.
    """
    config_name, overrides = None, []
    rest = iter(args)
    for arg in rest:
        if arg in ("--config-name", "-cn"):
            config_name = next(rest, None)
        elif arg.startswith("--config-name="):
            config_name = arg.partition("=")[2]
        else:
            overrides.append(arg)
    overrides = rewrite_aliases(overrides)
    config_name = config_name or preset_for(overrides)
    if not any(arg.startswith("-") for arg in overrides):
        try:
            load_config(overrides, config_name=config_name)
        except ConfigError as exc:
            _exit_config_error(exc)
    return [f"--config-name={config_name}", *overrides]


@hydra.main(config_path="conf", config_name="demo", version_base=None)
def main(cfg: DictConfig) -> None:
    from data.reward import RewardError  # deferred: these import Ray and torch
    from single_controller.ray.health import WorkerDiedError
    from trainer.checkpoint import CheckpointError
    from trainer.ppo_trainer import NonFiniteLossError
    from trainer.preemption import EXIT_PREEMPTED, Preempted

    try:
        run_ppo(to_config(cfg))
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
    sys.argv[1:] = _prepare_command_line(sys.argv[1:])
    main()
