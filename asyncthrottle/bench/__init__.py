"""``python -m asyncthrottle bench``: what a user runs to choose a setting on their own machine."""
