"""C{python -m crashloop}: the same as C{python -m crashloop.loop}."""

from crashloop.loop import main

if __name__ == "__main__":
    raise SystemExit(main())
