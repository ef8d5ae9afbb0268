"""verl's ``verl.trainer``: see ppo/core_algos.py."""
