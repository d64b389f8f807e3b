"""C{python -m fuzz}: the same as C{python -m fuzz.campaign}."""

from fuzz.campaign import main

if __name__ == "__main__":
    raise SystemExit(main())
