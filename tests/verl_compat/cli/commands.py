"""verl's quickstart and example command lines (docs/start/quickstart.rst, examples/*_trainer/*.sh), key for key.

Only the paths are local and the GPU counts scaled down to this machine's 2 workers
(``trainer.n_gpus_per_node=2``); every other key and value is the script's. ``{model}``, ``{train}`` and
``{val}`` are filled in by the tests.
"""

from __future__ import annotations

QUICKSTART = """
data.train_files={train} data.val_files={val} data.train_batch_size=256 data.max_prompt_length=512
data.max_response_length=256 actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 actor_rollout_ref.rollout.tensor_model_parallel_size=1
actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
critic.optim.lr=1e-5 critic.model.path={model} critic.ppo_micro_batch_size_per_gpu=4 algorithm.kl_ctrl.kl_coef=0.001
trainer.logger=['console'] trainer.val_before_train=False trainer.default_hdfs_dir=null trainer.n_gpus_per_node=2
trainer.nnodes=1 trainer.save_freq=10 trainer.test_freq=10 trainer.total_epochs=15
"""

# examples/ppo_trainer/run_deepseek7b_llm.sh
PPO = """
algorithm.adv_estimator=gae data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=512 data.max_response_length=512 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 actor_rollout_ref.rollout.tensor_model_parallel_size=4
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.4 critic.optim.lr=1e-5
critic.model.use_remove_padding=True critic.model.path={model} critic.model.enable_gradient_checkpointing=True
critic.ppo_micro_batch_size_per_gpu=32 critic.model.fsdp_config.param_offload=False
critic.model.fsdp_config.optimizer_offload=False algorithm.use_kl_in_reward=False trainer.critic_warmup=0
trainer.logger='["console","wandb"]' trainer.project_name='verl_example_gsm8k'
trainer.experiment_name='deepseek_llm_7b_function_rm' trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=20
trainer.test_freq=1 trainer.use_legacy_worker_impl=auto trainer.total_epochs=15
"""

# examples/grpo_trainer/run_qwen2-7b.sh
GRPO = """
algorithm.adv_estimator=grpo data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console','wandb']
trainer.project_name='verl_grpo_example_gsm8k' trainer.experiment_name='qwen2_7b_function_rm' trainer.n_gpus_per_node=2
trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
"""

# examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh
GRPO_LORA = """
algorithm.adv_estimator=grpo trainer.val_before_train=False data.train_files={train} data.val_files={val}
data.train_batch_size=16 data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True
data.truncation='error' data.shuffle=False actor_rollout_ref.model.path={model} actor_rollout_ref.model.lora_rank=64
actor_rollout_ref.model.lora_alpha=32 actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=low_var_kl actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.rollout.load_format=safetensors actor_rollout_ref.rollout.layered_summon=True
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger='["console","wandb"]'
trainer.project_name='verl_grpo_example_gsm8k' trainer.experiment_name='qwen2.5_3b_grpo_lora' trainer.n_gpus_per_node=2
trainer.nnodes=1 trainer.save_freq=20 trainer.test_freq=5 trainer.total_epochs=15
"""

# examples/rloo_trainer/run_qwen2-7b.sh
RLOO = """
algorithm.adv_estimator=rloo data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=256 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=80
actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.model.enable_gradient_checkpointing=True
actor_rollout_ref.actor.fsdp_config.param_offload=False actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=160 actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=5
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=160 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=True algorithm.kl_penalty=kl algorithm.kl_ctrl.kl_coef=0.001 trainer.critic_warmup=0
trainer.logger=['console','wandb'] trainer.project_name='verl_rloo_example_gsm8k'
trainer.experiment_name='qwen2_7b_function_rm' trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=-1
trainer.test_freq=5 trainer.total_epochs=15
"""

# examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh
REMAX = """
algorithm.adv_estimator=remax data.train_files={train} data.val_files={val} data.train_batch_size=512
data.max_prompt_length=512 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=128 actor_rollout_ref.actor.use_dynamic_bsz=True
actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000 actor_rollout_ref.actor.use_kl_loss=False
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.tensor_model_parallel_size=2
actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.gpu_memory_utilization=0.8 actor_rollout_ref.rollout.n=4
actor_rollout_ref.ref.fsdp_config.param_offload=True algorithm.use_kl_in_reward=True algorithm.kl_penalty=kl
algorithm.kl_ctrl.kl_coef=0.001 trainer.critic_warmup=0 trainer.logger=['console','wandb']
trainer.project_name='verl_remax_example_gsm8k' trainer.experiment_name='qwen2.5_3b_function_rm_kl1e-3'
trainer.val_before_train=False trainer.n_gpus_per_node=2 trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=5
trainer.total_epochs=5
"""

# examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh
REINFORCE_PP = """
algorithm.adv_estimator=reinforce_plus_plus data.train_files={train} data.val_files={val} data.train_batch_size=1024
data.max_prompt_length=1024 data.max_response_length=1024 data.filter_overlong_prompts=True data.truncation='error'
actor_rollout_ref.model.path={model} actor_rollout_ref.actor.optim.lr=3e-6 actor_rollout_ref.model.use_remove_padding=True
actor_rollout_ref.actor.ppo_mini_batch_size=1024 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001
actor_rollout_ref.actor.kl_loss_type=mse actor_rollout_ref.actor.entropy_coeff=0
actor_rollout_ref.model.enable_gradient_checkpointing=True actor_rollout_ref.actor.fsdp_config.param_offload=False
actor_rollout_ref.actor.fsdp_config.optimizer_offload=False actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
actor_rollout_ref.rollout.tensor_model_parallel_size=2 actor_rollout_ref.rollout.name=vllm
actor_rollout_ref.rollout.gpu_memory_utilization=0.6 actor_rollout_ref.rollout.n=8
actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 actor_rollout_ref.ref.fsdp_config.param_offload=True
algorithm.use_kl_in_reward=False trainer.critic_warmup=0 trainer.logger=['console','wandb']
trainer.project_name='verl_grpo_example_gsm8k' trainer.experiment_name='qwen2_7b_function_rm' trainer.n_gpus_per_node=2
trainer.nnodes=1 trainer.save_freq=-1 trainer.test_freq=5 trainer.total_epochs=15
"""


def overrides(command: str, **paths: str) -> list[str]:
    """The ``key=value`` words of a command line as Hydra receives them: bash has removed the single quotes."""
    return [word.replace("'", "") for word in command.format(**paths).split()]
