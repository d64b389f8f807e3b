"""Checking a backend's C{key=value} options, shared by the backends."""

from brokerd.units import parse_size


def given_options(backend, options):
    """Every option of C{backend}, as given or defaulted; a ValueError names an unknown one."""
    unknown = sorted(set(options) - set(backend.options))
    if unknown:
        known = ", ".join(sorted(backend.options))
        raise ValueError(f"no option {unknown[0]!r}; the options are: {known}")
    return {name: options.get(name, default) for name, (default, _) in backend.options.items()}


def whole_number(name, text, smallest=1):
    """An option's text as an integer of at least C{smallest}; the ValueError names the option."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = smallest - 1
    if value < smallest:
        raise ValueError(f"option {name} must be a whole number of at least {smallest},"
                         f" not {text!r}")
    return value


def byte_size(name, text, smallest=0):
    """An option's text as a byte size like C{64M}; the ValueError names the option."""
    try:
        value = parse_size(text)
    except ValueError as problem:
        raise ValueError(f"option {name}: {problem}") from None
    if value < smallest:
        raise ValueError(f"option {name} must be at least {smallest} bytes, not {text!r}")
    return value
