"""AMQP 0-9-1 wire adapter."""
