"""Assembling a run from a typed config: check the model and data, fill the built-in demo's paths, build the trainer.

``build_trainer(cfg)`` is what ``python main.py`` runs after loading the config, and what tests and benchmarks
call to get the same trainer; it starts no Ray and no workers (``trainer.running.run`` does, then ``fit``).
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, fields
from typing import Any

from omegaconf import OmegaConf
from transformers import AutoConfig, AutoTokenizer

from config import ConfigError, PPOConfig, replace_keys, resolve_device
from config.adapter import installed
from config.tree import plain
from data.builtin import demo_model_config, prepare_builtin
from data.dataset import RLHFDataset, make_dataloader
from data.reward import DAPORewardManager, GDPORewardManager, RewardManager, load_custom_compute_score
from data.reward_loop import (
    REWARD_MANAGERS,
    ConcurrentRewardManager,
    ImportedRewardManager,
    RemoteRewardManager,
    load_manager_class,
)
from data.reward_pool import UserFunction
from planner import StepPlan, make_plan, num_workers
from trainer.preflight.dry_run import check_models, preflight
from trainer.running.ppo_trainer import RayPPOTrainer
from workers.compute.agent_loop import check_tools
from workers.compute.vllm_engine import check_vllm
from workers.parallel.lora import check_target_modules
from workers.tools import ToolConfigError


def build_trainer(cfg: PPOConfig, plan: StepPlan | None = None) -> RayPPOTrainer:
    """Check ``cfg``, prepare model/data (the built-in demo when paths are null) and build the trainer.

    ``plan`` is ``cfg``'s step plan when the caller has it already (``planner.load_with_plan``), else computed here.
    """
    plan = plan or make_plan(cfg, num_workers(cfg))
    check_models(cfg, plan)  # before the memory check reads the models' configs
    preflight(cfg, plan, lambda: demo_model_config(cfg.builtin))  # the memory check
    cfg = replace_keys(cfg, {"trainer.device": resolve_device(cfg)})
    check_vllm(cfg.actor_rollout_ref.rollout, cfg.trainer.device, plan.n_workers, _actor_config(cfg))
    for line in installed().warnings(cfg):  # keys set that nothing honours (config.adapter)
        print(f"colorl: warning: {line}", file=sys.stderr)
    _check_optimizers(cfg)
    compute_score = _load_compute_score(cfg)
    cfg = _fill_paths(cfg)
    model = cfg.actor_rollout_ref.model
    check_target_modules(model)
    tokenizer = AutoTokenizer.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    train_dataloader, val_dataloader = _build_dataloaders(cfg, tokenizer, _tool_schemas(cfg, tokenizer))
    reward_fn = make_reward_manager(cfg, tokenizer, compute_score)
    if compute_score is not None:  # the user's function, tried once on the first prompt before any model loads
        reward_fn.probe(train_dataloader.dataset[0], "reward.custom_reward_function.name")
    return RayPPOTrainer(
        config=cfg,
        tokenizer=tokenizer,
        train_dataloader=train_dataloader,
        val_dataloader=val_dataloader,
        reward_fn=reward_fn,
        val_reward_fn=make_reward_manager(cfg, tokenizer, compute_score),
        plan=plan,
    )


def _actor_config(cfg: PPOConfig) -> tuple[str, Callable[[], Any]]:
    """The actor's model, named as the user gave it, and a reader of its transformers config."""
    model = cfg.actor_rollout_ref.model

    def read() -> Any:
        if model.path is None:
            return demo_model_config(cfg.builtin)
        return AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)

    if model.path is None:
        return f"the built-in demo model (builtin.hidden_size={cfg.builtin.hidden_size})", read
    return f"actor_rollout_ref.model.path={model.path}", read


def make_reward_manager(cfg: PPOConfig, tokenizer: Any, compute_score: Any) -> RewardManager:
    """``reward.reward_manager.name`` (``data.reward_loop.REWARD_MANAGERS``) with the ``reward.reward_kwargs`` set away
    from their defaults as keyword arguments (the dapo manager's ``max_resp_len``, null: data.max_response_length);
    ``ConfigError`` for an unknown name or arguments the manager does not take, before any model loads."""
    name, kwargs = cfg.reward.reward_manager.name, cfg.reward.reward_kwargs
    if cfg.reward.reward_manager.source == "importlib":
        return _imported_manager(cfg, tokenizer, compute_score)
    if name not in REWARD_MANAGERS:
        raise ConfigError.invalid("reward.reward_manager.name", name, f"must be one of {', '.join(REWARD_MANAGERS)}")
    if name == "batch" and compute_score is None:
        raise ConfigError.invalid(
            "reward.reward_manager.name", name, "calls reward.custom_reward_function with lists: set its path"
        )
    cls, unset = REWARD_MANAGERS[name], type(kwargs)()
    given = {
        f.name: getattr(kwargs, f.name) for f in fields(kwargs) if getattr(kwargs, f.name) != getattr(unset, f.name)
    }
    if cls is DAPORewardManager:  # it takes both; a null max_resp_len is the response limit
        given = {
            "overlong_buffer_cfg": kwargs.overlong_buffer_cfg,
            "max_resp_len": kwargs.max_resp_len or cfg.data.max_response_length,
        }
    given.update(_loop_arguments(cfg, cls))
    try:
        return cls(tokenizer, compute_score=compute_score, reward_fn_key=cfg.data.reward_fn_key, **given)
    except TypeError:
        key = next(iter(given))
        raise ConfigError.invalid(
            f"reward.reward_kwargs.{key}", given[key], f"the {name} reward manager takes no such argument (dapo does)"
        ) from None


def _imported_manager(cfg: PPOConfig, tokenizer: Any, compute_score: Any) -> ImportedRewardManager:
    """The user's reward-manager class (``source=importlib``), built with the manager protocol's arguments (the whole
    config as a DictConfig, the tokenizer, the reward function); a class that is not there or cannot be built is a
    ``ConfigError``."""
    manager = cfg.reward.reward_manager
    try:
        cls = load_manager_class(manager.module.path, manager.name)
    except FileNotFoundError:
        raise ConfigError.invalid("reward.reward_manager.module.path", manager.module.path, "no such file") from None
    except AttributeError as exc:
        raise ConfigError.invalid("reward.reward_manager.name", manager.name, str(exc)) from None
    except Exception as exc:  # the user's module failed to import
        raise ConfigError.invalid(
            "reward.reward_manager.module.path", manager.module.path, f"importing it raised {_first_line(exc)}"
        ) from None
    config = OmegaConf.create(plain(asdict(cfg)))  # a manager class takes the whole config, as a DictConfig
    try:
        return ImportedRewardManager(
            tokenizer,
            compute_score=compute_score,
            reward_fn_key=cfg.data.reward_fn_key,
            manager_cls=cls,
            config=config,
            timeout=cfg.reward.timeout,
        )
    except Exception as exc:
        raise ConfigError.invalid(
            "reward.reward_manager.name",
            manager.name,
            f"building it with the config, tokenizer and compute_score raised {_first_line(exc)}",
        ) from None


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _loop_arguments(cfg: PPOConfig, cls: type[RewardManager]) -> dict[str, Any]:
    """The ``reward`` keys of the reward loop that manager ``cls`` reads (data.reward_loop)."""
    reward = cfg.reward
    if cls is GDPORewardManager:
        return {"experiment_name": cfg.trainer.experiment_name}
    if not issubclass(cls, ConcurrentRewardManager):
        return {}
    limits = {"timeout": reward.timeout, "max_rpm": reward.max_rpm, "max_tpm": reward.max_tpm}
    limits["estimated_tokens_per_request"] = reward.estimated_tokens_per_request
    if cls is RemoteRewardManager:
        return {**limits, "num_workers": reward.num_workers}
    return {**limits, "max_concurrent": reward.max_concurrent}


def _check_optimizers(cfg: PPOConfig) -> None:
    """Each trained role's ``optim.optimizer`` must be a class of ``optim.optimizer_impl``."""
    for role, optim in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor.optim), ("critic", cfg.critic.optim)):
        try:
            module = importlib.import_module(optim.optimizer_impl)
        except ImportError as exc:
            raise ConfigError.invalid(f"{role}.optim.optimizer_impl", optim.optimizer_impl, str(exc)) from None
        if not isinstance(getattr(module, optim.optimizer, None), type):
            raise ConfigError.invalid(
                f"{role}.optim.optimizer", optim.optimizer, f"no such optimizer class in {optim.optimizer_impl}"
            )


def _load_compute_score(cfg: PPOConfig) -> Any:
    """The user's ``reward.custom_reward_function.path/name``, or None for the built-in rewards (by data source)."""
    custom = cfg.reward.custom_reward_function
    if custom.path is None:
        return None
    try:
        function = load_custom_compute_score(custom.path, custom.name)
    except FileNotFoundError:
        raise ConfigError.invalid(
            "reward.custom_reward_function.path",
            custom.path,
            "no such file; expected a Python file defining the reward function",
        ) from None
    except AttributeError as exc:
        raise ConfigError.invalid("reward.custom_reward_function.name", custom.name, str(exc)) from None
    except Exception as exc:  # the user's module failed to import: report it as the config mistake it is
        raise ConfigError.invalid(
            "reward.custom_reward_function.path", custom.path, f"importing it raised {_first_line(exc)}"
        ) from None
    if not isinstance(function, UserFunction):  # async: awaited within reward.timeout
        return function
    # each call in a killable worker process within reward.timeout, as many at a time as the machine has cores
    return function.bounded(cfg.reward.timeout, min(cfg.reward.num_workers, os.cpu_count() or 1))


def _fill_paths(cfg: PPOConfig) -> PPOConfig:
    """``cfg`` with null model/data paths pointing at the built-in demo assets (built once, then reused from the
    cache), a null critic path at the actor's model, and the output directory absolute, since every worker writes
    checkpoint shards there from its own working directory (on another node, or under ``ray job submit`` a
    per-node copy of the job's)."""
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
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    for key in ("tool_config_path", "function_tool_path"):  # the workers load the tools from their own directory
        if getattr(multi_turn, key):
            paths[f"actor_rollout_ref.rollout.multi_turn.{key}"] = os.path.abspath(getattr(multi_turn, key))
    model_path = paths.get("actor_rollout_ref.model.path", model.path)
    if cfg.critic.model.path is None:
        paths["critic.model.path"] = model_path
    return replace_keys(cfg, paths)


def _tool_schemas(cfg: PPOConfig, tokenizer: Any) -> list[dict] | None:
    """With rollout.multi_turn.enable, the tools' schemas (tool_agent prompts show them), after checking that the
    tools load and that the chat template renders a tool turn; None without multi-turn."""
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    if not multi_turn.enable:
        return None
    try:
        schemas = check_tools(tokenizer, multi_turn)
    except ToolConfigError as exc:
        key = exc.key or "tool_config_path"
        raise ConfigError.invalid(
            f"actor_rollout_ref.rollout.multi_turn.{key}", getattr(multi_turn, key), str(exc)
        ) from None
    if not schemas:
        print(
            "colorl: warning: actor_rollout_ref.rollout.multi_turn.enable=true without tool_config_path or "
            "function_tool_path: every tool call is answered 'unknown tool'",
            file=sys.stderr,
        )
    return schemas


def _build_dataloaders(cfg: PPOConfig, tokenizer: Any, tool_schemas: list[dict] | None = None) -> tuple[Any, Any]:
    """(train, val) loaders; val is None without data.val_files and holds the whole set when val_batch_size is null.
    ``tool_schemas`` (multi-turn): rendered into the prompts of tool_agent rows."""
    data = cfg.data
    default_agent = cfg.actor_rollout_ref.rollout.agent.default_agent_loop

    def dataset(key: str, max_samples: int) -> RLHFDataset:
        files = getattr(data, key)
        try:
            built = RLHFDataset(
                files,
                tokenizer,
                data.prompt_key,
                data.max_prompt_length,
                data.filter_overlong_prompts,
                data.truncation,
                max_samples,
                tool_schemas,
                default_agent,
                data.reward_fn_key,
                data.apply_chat_template_kwargs,
            )
        except (FileNotFoundError, ValueError) as exc:  # a missing, unreadable or empty file, a missing column,
            # a prompt cell that is not a prompt, every prompt too long
            shown = files if isinstance(files, str) else list(files)
            raise ConfigError.invalid(f"data.{key}", shown, str(exc)) from None
        if (built.num_tool_agent_rows > 0) != (tool_schemas is not None):
            print(
                f"colorl: warning: data.{key}: {built.num_tool_agent_rows} of {len(built)} rows are tool_agent rows "
                f"and actor_rollout_ref.rollout.multi_turn.enable={tool_schemas is not None}: "
                f"{'they are generated single-turn' if tool_schemas is None else 'no row calls tools'}",
                file=sys.stderr,
            )
        return built

    train = dataset("train_files", data.train_max_samples)
    # a step draws batches of data.gen_batch_size prompts when set (dynamic sampling), else one of train_batch_size
    key, size = (
        ("gen_batch_size", data.gen_batch_size) if data.gen_batch_size else ("train_batch_size", data.train_batch_size)
    )
    seed = cfg.trainer.seed if data.seed is None else data.seed  # null: trainer.seed (config.schema.DataConfig)
    train_dataloader = make_dataloader(
        train, size, shuffle=data.shuffle, seed=seed, drop_last=data.dataloader_drop_last
    )
    if len(train_dataloader) == 0:
        raise ConfigError(
            f"data.{key}={size}: larger than the {len(train)} training "
            "prompts (with data.dataloader_drop_last=true no batch is left)"
        )
    if data.val_files is None:
        return train_dataloader, None
    val = dataset("val_files", data.val_max_samples)
    val_dataloader = make_dataloader(val, data.val_batch_size or len(val), shuffle=False, drop_last=False)
    return train_dataloader, val_dataloader
