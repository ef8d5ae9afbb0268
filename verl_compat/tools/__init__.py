"""verl's ``verl.tools``: the tool interface a tool file written for verl imports, ColoRL's classes under verl's names
(the classes: workers/tools/base.py and registry.py)."""
