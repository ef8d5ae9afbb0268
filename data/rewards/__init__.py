"""Rule-based reward functions for public data sets (dispatched by ``data_source`` in ``data.tasks``)."""
