"""How the throughput benchmarks print what they measured."""

import json

from brokerd.loadgen.process_cpu import format_cores

PHASES = ("publish", "consume", "together")


def print_results(results, protocol, as_json=False):
    """
    One JSON object, or a small table of msgs/s per phase, each with the cores
    the broker kept busy meanwhile (the C{PHASE_broker_cpu} fields).
    """
    if as_json:
        print(json.dumps(results, indent=2))
        return
    print(f"{results['messages']} messages of {results['size']} bytes over {protocol}:")
    for phase in PHASES:
        cores = format_cores(results.get(phase + "_broker_cpu"))
        print(f"  {phase:<9} {results[phase + '_per_s']:>10,.0f} msg/s   broker {cores:>4} cores busy")
