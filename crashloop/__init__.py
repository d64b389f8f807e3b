"""The crash loop: a real broker killed with SIGKILL again and again under load,
and a check after each restart that nothing it confirmed was lost
(C{python -m crashloop})."""
