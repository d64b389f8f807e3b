"""The protocol-free session: a client connection, its channels, their consumers,
deliveries, publisher confirms and transactions, with the permission checks every
operation meets. Both wire adapters (L{brokerd.amqp}, L{brokerd.native}) and the HTTP API
drive the broker through these objects only."""
