"""verl's ``verl.trainer.ppo``: its algorithms' names and signatures (core_algos.py)."""
