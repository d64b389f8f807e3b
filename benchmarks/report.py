"""How the throughput benchmarks print what they measured."""

import json

PHASES = ("publish", "consume", "together")


def print_results(results, protocol, as_json=False):
    """One JSON object, or a small table of msgs/s per phase."""
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['messages']} messages of {results['size']} bytes over {protocol}:")
    for phase in PHASES:
        print(f"  {phase:<9} {results[phase + '_per_s']:>10,.0f} msg/s")
