"""brokerd: an AMQP 0-9-1 model message broker on Twisted with pluggable stores."""

__version__ = "0.1.0"
