"""Cross-backend validation: one seeded workload played against every storage
backend, and a PySpark job that compares what each one did (DESIGN section 5)."""
