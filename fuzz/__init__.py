"""Fuzzing brokerd's wire protocols with hostile input (C{python -m fuzz}), while
a canary client checks that everyone else is still served."""
