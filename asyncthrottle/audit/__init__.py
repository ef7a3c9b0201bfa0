"""The sync audit: the host reads of device values a loop makes, by line, under ``python -m
asyncthrottle run`` and :func:`asyncthrottle.testing.forbid_syncs` alike."""
