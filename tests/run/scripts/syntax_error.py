"""Does not compile (a parenthesis never closed): python prints its SyntaxError and exits 1
before the first line runs; ``run`` says the script did not start. Left out of ruff (pyproject's
``extend-exclude``) and of pytest's collection (``tests/run/conftest.py``)."""

print("never printed")
losses = (1.0,
