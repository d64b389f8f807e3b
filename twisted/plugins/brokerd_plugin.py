"""twistd plugin: ``twistd -n brokerd --backend=...`` (options in brokerd.process.tap)."""

from twisted.application.service import ServiceMaker

brokerd = ServiceMaker(
    "brokerd",
    "brokerd.process.tap",
    "A message broker following the AMQP 0-9-1 model, with pluggable storage backends",
    "brokerd",
)
