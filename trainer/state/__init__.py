"""What a run keeps between its steps and its restarts: checkpoint directories (``checkpoint``), the one run per
directory lock (``run_dir``), the position in the data (``data_position``), and what may change on resume
(``fingerprint``)."""
