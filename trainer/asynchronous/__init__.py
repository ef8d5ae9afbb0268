"""Generation ahead of training (``trainer.v1.trainer_mode``'s async modes): the modes' driver (``ahead``),
partial rollouts (``partial``) and the batches asked for ahead, oldest first (``replay_buffer``)."""
