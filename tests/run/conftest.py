"""The scripts under ``scripts/`` are programs that ``run`` runs, not test modules: they train (or
raise, or wait for torchrun's ranks) when imported, so ``--doctest-modules`` must not import them."""

collect_ignore = ["scripts"]
