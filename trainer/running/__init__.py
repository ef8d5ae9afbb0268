"""Running a run: build it from the config (``build``), start it (``run``), the driver (``ppo_trainer``) and its
step as the phase table (``step``) with the driver's own phases (``advantage``, ``balance``, ``dynamic_sampling``,
``validation``), where each role lives (``placement``, ``routing``), and what keeps it going or ends it cleanly
(``restarts``, ``preemption``, ``watchdog``, ``faults``, ``console``)."""
