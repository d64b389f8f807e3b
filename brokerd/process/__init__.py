"""The broker as a running process: C{twistd brokerd}'s options, the service that
opens the stores and listeners, what it reports at start-up, stopping without
breaking a promise, and giving freed memory back to the system."""
