"""What the fuzzer found: tracebacks read from the broker's log, and the summary it prints.

A traceback is a "Traceback (most recent call last)" line in the broker's
output (log.failure and unhandled errors both write one). Tracebacks are told
apart by their exception type and the innermost frame, and each distinct one is
reported with how often it came and the inputs that came just before it.
"""

import re

TRACEBACK = "Traceback (most recent call last)"
FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>\S+)')
TIMESTAMP = re.compile(r"^\S+ \[(?P<source>[^\]]+)\] ")
SHOWN = 5  # deaths and canary failures printed in full
SHOWN_TRACEBACKS = 12  # distinct tracebacks printed in full


class BrokerLog:
    """The output of each broker process in turn, scanned for tracebacks as it grows."""

    def __init__(self):
        self.outputs = []  # (lines, scanned up to)
        self.traceback_count = 0
        self.signatures = {}  # signature -> {"count", "exception", "where", "logged", "after": [inputs]}
        self.current_input = "start"

    def attach(self, lines):
        self.outputs.append([lines, 0])

    def scan(self):
        """Read the lines printed since the last scan; tracebacks there go to C{current_input}."""
        for entry in self.outputs:
            lines, start = entry
            end = len(lines)
            # A traceback still being printed is read next time.
            while end > start and lines[end - 1].startswith("\t"):
                end -= 1
            for index in range(start, end):
                if TRACEBACK in lines[index]:
                    self._found(lines, index, end)
            entry[1] = end

    def _found(self, lines, index, end):
        self.traceback_count += 1
        block = [lines[index]]
        for line in lines[index + 1 : end]:
            if not line.startswith(("\t", " ")) and TIMESTAMP.match(line):
                break
            block.append(line)
        exception = next((line.strip() for line in reversed(block) if line.strip()), "?")
        frames = [FRAME.search(line) for line in block]
        frames = [match for match in frames if match]
        where = f"{_short(frames[-1]['file'])}:{frames[-1]['line']} in {frames[-1]['function']}" if frames else "?"
        logged = lines[index - 1] if index and TRACEBACK not in lines[index - 1] else lines[index]
        logged = TIMESTAMP.sub("", logged).strip()
        signature = f"{exception.split(':')[0]} at {where}"
        entry = self.signatures.setdefault(
            signature, {"count": 0, "exception": exception[:300], "where": where, "logged": logged[:300], "after": []})
        entry["count"] += 1
        if len(entry["after"]) < 3:
            entry["after"].append(self.current_input)

    def distinct(self):
        return sorted(self.signatures.values(), key=lambda entry: -entry["count"])


def _short(path):
    for marker in ("/brokerd/", "/backends/", "/twisted/", "/google/", "/pamqp/"):
        if marker in path:
            return marker.strip("/") + "/" + path.split(marker, 1)[1]
    return path


def format_summary(results):
    """The human-readable summary of L{fuzz.campaign.Fuzzer.results}."""
    mib = 2**20
    lines = [
        f"fuzz: seed {results['seed']}, backend {results['backend']}, {results['seconds']:g} s,"
        f" protocols {','.join(results['protocols'])}, broker code from {results['broker_code']}",
        f"inputs tried: {results['inputs']}",
    ]
    lines += [f"  {kind}: {count}" for kind, count in results["inputs_by_kind"].items()]
    lines.append(f"broker deaths: {results['deaths']}")
    for death in results["death_details"][:SHOWN]:
        lines.append(f"  after {death['after']}: {death['what']}")
        lines += [f"    | {line}" for line in death.get("log", [])[-4:]]
    distinct = results["distinct_tracebacks"]
    lines.append(f"tracebacks in the broker log: {results['tracebacks']} ({len(distinct)} distinct)")
    for entry in distinct[:SHOWN_TRACEBACKS]:
        lines.append(f"  [{entry['count']}x] {entry['exception']}")
        lines.append(f"       at {entry['where']}; logged as: {entry['logged']}")
        lines += [f"       after {after}" for after in entry["after"][:2]]
    if len(distinct) > SHOWN_TRACEBACKS:
        lines.append(f"  ... {len(distinct) - SHOWN_TRACEBACKS} more distinct ones (--json lists them all)")
    lines.append(f"canary failures: {results['canary_failures']}")
    for failure in results["canary_failure_details"][:SHOWN]:
        lines.append(f"  after {failure['after']}:")
        lines.append(f"       {failure['what']}")
    if results["canary_failures"] > SHOWN:
        lines.append(f"  ... {results['canary_failures'] - SHOWN} more (--json lists them all)")
    lines.append(f"slowest canary: {results['slowest_canary_seconds']:.2f} s, after {results['slowest_canary_after']}")
    internal = {key: count for key, count in results["replies"].items() if key.endswith(" 541")}
    lines.append("closes the inputs got (protocol code: count): "
                 + (", ".join(f"{key}: {count}" for key, count in results["replies"].items()) or "none"))
    if internal:
        lines.append(f"  541 INTERNAL_ERROR answers to bad input: {sum(internal.values())}")
    limit = results["watermark"] + results["rss_margin"]
    verdict = "over" if results["peak_rss"] > limit else "within"
    watermark = results["watermark"] / mib
    lines.append(f"peak RSS of the broker: {results['peak_rss'] / mib:.0f} MiB (watermark {watermark:.0f}"
                 f" MiB; {verdict} watermark + margin = {limit / mib:.0f} MiB)")
    lines += [f"  +{raiser['mib']} MiB during {raiser['input']}" for raiser in results["rss_raisers"]]
    lines.append(f"restart after SIGKILL: {results['restart']}")
    lines.append(f"fuzzer's own CPU: {results['fuzzer_cpu_seconds']:.1f} s in {results['wall_seconds']:.0f} s")
    bad = results["deaths"] or results["tracebacks"] or results["canary_failures"] or verdict == "over"
    lines.append(f"result: {'FAIL' if bad else 'ok'} (deaths {results['deaths']}, tracebacks {results['tracebacks']},"
                 f" canary failures {results['canary_failures']}, peak RSS {verdict} watermark + margin)")
    return "\n".join(lines)
