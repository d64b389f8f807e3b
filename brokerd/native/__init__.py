"""brokerd's native wire protocol: length-prefixed protobuf envelopes, many
channels per connection. C{server} is the broker side, C{client} a Twisted
client, C{cli} the ``brokerd-native`` (``python -m brokerd.native``) command line."""
