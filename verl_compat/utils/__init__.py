"""verl's ``verl.utils``: the utilities ported code imports that ColoRL has (docs/verl_api.md lists what a user
writes for the others)."""
