"""The AMQP 0-9-1 model, free of any wire protocol: virtual hosts, exchanges
(with their routing), queues, bindings and messages."""
