"""What a run shows its user: step metrics (``metrics``), the tracking backends (``tracking``), warnings when
training stops learning (``health``), the run report (``report``) and the samples it shows (``generations``)."""
