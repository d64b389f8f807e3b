"""The workload runner's side of its clients: every publisher and consumer of a
run is a process of its own (L{spark_jobs.clients}), started with the spawn
method so that each imports its client library afresh. The runner starts
them, looks after each step whether one failed (and why, as the client
reported it through the run's L{RunControl<spark_jobs.control.RunControl>}),
waits for them to end, and ends them after a failure so that nothing outlives
the run.
"""

import multiprocessing.connection

from spark_jobs import fast_clients, pika_clients
from spark_jobs.brokers import WorkloadFailed

CLIENT_EXIT_TIMEOUT = 60.0  # seconds for a client process to end once its work is done


class ClientProcesses:
    """
    A run's client processes, in the order of the rows of the run's counters
    (L{RunControl.counters<spark_jobs.control.RunControl.counters>}):
    publishers first, then consumers.
    """

    def __init__(self, context, control, label):
        """
        @param context: the multiprocessing context the processes start in.
        @param control: the run's L{spark_jobs.control.RunControl}, shared with every client.
        @param label: the run's label, which error messages name.
        """
        self._context = context
        self._control = control
        self._label = label
        self._publishers = []
        self._consumers = []

    def start(self, config, settings):
        """Starts every consumer, then every publisher, of the client library C{settings.client}
        names, each with the run's L{ClientConfig<spark_jobs.clients.ClientConfig>} C{config}."""
        library = fast_clients if settings.client == "fast" else pika_clients
        for number in range(settings.consumers):
            self._consumers.append(
                self._spawn(library.run_consumer, config, f"consumer-{number}", number))
        for number in range(settings.publishers):
            self._publishers.append(
                self._spawn(library.run_publisher, config, f"publisher-{number}", number))

    def _spawn(self, target, config, name, number):
        process = self._context.Process(target=target, args=(config, self._control, number),
                                        name=name, daemon=True)
        process.start()
        return process

    def publishing(self):
        """Whether a publisher process is still running."""
        return any(process.is_alive() for process in self._publishers)

    def wait_for_a_publisher(self, timeout):
        """Waits until a running publisher process ends, at most C{timeout} seconds."""
        running = [process.sentinel for process in self._publishers if process.is_alive()]
        multiprocessing.connection.wait(running, timeout)

    def check(self):
        """
        @raise WorkloadFailed: a client process exited with an error; the
            message says which, with the reason each reported.
        """
        failed = [process for process in self._publishers + self._consumers
                  if process.exitcode not in (None, 0)]
        if failed:
            reasons = dict(self._control.failures())
            details = [f"{process.name} exited with status {process.exitcode}:"
                       f"\n{reasons.get(process.name, '(no reason reported)')}"
                       for process in failed]
            raise WorkloadFailed(
                f"{self._label}: client processes failed:\n" + "\n".join(details))

    def stop_consumers(self):
        """
        Tells the consumers to stop, and waits for each process to end.

        @raise WorkloadFailed: one did not end within L{CLIENT_EXIT_TIMEOUT}.
        """
        self._control.stop.set()
        for process in self._consumers:
            process.join(CLIENT_EXIT_TIMEOUT)
            if process.is_alive():
                raise WorkloadFailed(f"{self._label}: {process.name} did not end within"
                                     f" {CLIENT_EXIT_TIMEOUT:.0f} s")

    def abandon(self):
        """After a failure: ends every client process."""
        self._control.stop.set()
        for process in self._publishers + self._consumers:
            if process.is_alive():
                process.terminate()
        for process in self._publishers + self._consumers:
            process.join(CLIENT_EXIT_TIMEOUT)

    def counters(self):
        """Each client's counters (L{spark_jobs.control.COUNTER_NAMES}) by its process name, for
        run.json."""
        return {process.name: self._control.counters(row)
                for row, process in enumerate(self._publishers + self._consumers)}
