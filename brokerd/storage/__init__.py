"""The broker's side of storage: durability (group commit and the --sync
policies), the registry that finds backends by name and builds their stores, and
the stores of their own that vhosts may have. The backends themselves live in
the top-level L{backends} package and are found through entry points."""
