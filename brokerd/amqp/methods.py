"""AMQP channel-level methods, each translated into one L{brokerd.session.channel.Channel} call.

Every handler takes the L{brokerd.amqp.channel.AmqpChannel} the method came on and the method as
pamqp decoded it, calls the model's channel, and answers with the method's -ok unless the client
asked for nowait. Rules (names, equivalence, exclusivity, tags) live in the channel and the
model; a rule broken there raises the error sent back.
"""

from pamqp import commands
from twisted.python.failure import Failure

from brokerd.amqp import frames
from brokerd.errors import MethodNotImplemented

CHANNEL_METHODS = {}


def _handles(method_class):
    """Registers a handler for C{method_class} in L{CHANNEL_METHODS} by its method index."""

    def register(function):
        CHANNEL_METHODS[method_class.index] = function
        return function

    return register


def _reply(channel, method):
    channel.writes.send(frames.method_frame(channel.id, method))


# -- channel


@_handles(commands.Channel.Close)
def channel_close(channel, method):
    channel.close_by_client()


@_handles(commands.Channel.CloseOk)
def channel_close_ok(channel, method):
    pass  # only meaningful while we wait for it, which AmqpChannel.method_frame handles


@_handles(commands.Channel.Flow)
def channel_flow(channel, method):
    _reply(channel, commands.Channel.FlowOk(active=channel.model.flow(bool(method.active))))


@_handles(commands.Channel.FlowOk)
def channel_flow_ok(channel, method):
    pass  # the broker never sends channel.flow, so there is nothing to confirm


# -- exchanges


@_handles(commands.Exchange.Declare)
def exchange_declare(channel, method):
    channel.model.exchange_declare(
        method.exchange,
        method.exchange_type or "direct",
        method.passive,
        method.durable,
        method.auto_delete,
        method.internal,
        method.arguments or {},
    )
    if not method.nowait:
        _reply(channel, commands.Exchange.DeclareOk())


@_handles(commands.Exchange.Delete)
def exchange_delete(channel, method):
    channel.model.exchange_delete(method.exchange, method.if_unused)
    if not method.nowait:
        _reply(channel, commands.Exchange.DeleteOk())


@_handles(commands.Exchange.Bind)
def exchange_bind(channel, method):
    channel.model.exchange_bind(
        method.destination, method.source, method.routing_key, method.arguments or {}
    )
    if not method.nowait:
        _reply(channel, commands.Exchange.BindOk())


@_handles(commands.Exchange.Unbind)
def exchange_unbind(channel, method):
    channel.model.exchange_unbind(
        method.destination, method.source, method.routing_key, method.arguments or {}
    )
    if not method.nowait:
        _reply(channel, commands.Exchange.UnbindOk())


# -- queues


@_handles(commands.Queue.Declare)
def queue_declare(channel, method):
    name, message_count, consumer_count = channel.model.queue_declare(
        method.queue, method.passive, method.durable, method.exclusive, method.auto_delete,
        method.arguments or {},
    )
    if not method.nowait:
        channel.writes.send(
            frames.encode_declare_ok(channel.id, name, message_count, consumer_count)
        )


@_handles(commands.Queue.Bind)
def queue_bind(channel, method):
    channel.model.queue_bind(
        method.queue, method.exchange, method.routing_key, method.arguments or {}
    )
    if not method.nowait:
        _reply(channel, commands.Queue.BindOk())


@_handles(commands.Queue.Unbind)
def queue_unbind(channel, method):
    channel.model.queue_unbind(
        method.queue, method.exchange, method.routing_key, method.arguments or {}
    )
    _reply(channel, commands.Queue.UnbindOk())


@_handles(commands.Queue.Purge)
def queue_purge(channel, method):
    count = channel.model.queue_purge(method.queue)
    if not method.nowait:
        _reply(channel, commands.Queue.PurgeOk(message_count=count))


@_handles(commands.Queue.Delete)
def queue_delete(channel, method):
    count = channel.model.queue_delete(method.queue, method.if_unused, method.if_empty)
    if not method.nowait:
        _reply(channel, commands.Queue.DeleteOk(message_count=count))


# -- basic


@_handles(commands.Basic.Qos)
def basic_qos(channel, method):
    if method.prefetch_size:
        raise MethodNotImplemented(f"prefetch_size={method.prefetch_size}")
    channel.model.basic_qos(method.prefetch_count, method.global_)
    _reply(channel, commands.Basic.QosOk())


@_handles(commands.Basic.Consume)
def basic_consume(channel, method):
    tag = channel.model.basic_consume(
        method.queue, method.consumer_tag, method.no_ack, method.exclusive, method.arguments or {}
    )
    if not method.nowait:
        channel.writes.send(
            frames.encode_consumer_tag_method(channel.id, commands.Basic.ConsumeOk.index, tag)
        )


@_handles(commands.Basic.Cancel)
def basic_cancel(channel, method):
    channel.model.basic_cancel(method.consumer_tag)
    channel.forget_consumer(method.consumer_tag)
    if not method.nowait:
        channel.writes.send(
            frames.encode_consumer_tag_method(
                channel.id, commands.Basic.CancelOk.index, method.consumer_tag
            )
        )


@_handles(commands.Basic.CancelOk)
def basic_cancel_ok(channel, method):
    pass  # a client may answer a broker-sent cancel; nothing is left to do


@_handles(commands.Basic.Get)
def basic_get(channel, method):
    result = channel.model.basic_get(method.queue, method.no_ack)
    if result is None:
        _reply(channel, commands.Basic.GetEmpty())
        return
    channel.get_ok(*result)


@_handles(commands.Basic.Nack)
def basic_nack(channel, method):
    channel.model.basic_nack(method.delivery_tag, method.multiple, method.requeue)


@_handles(commands.Basic.Reject)
def basic_reject(channel, method):
    channel.model.basic_reject(method.delivery_tag, method.requeue)


@_handles(commands.Basic.Recover)
def basic_recover(channel, method):
    channel.model.basic_recover(method.requeue)
    _reply(channel, commands.Basic.RecoverOk())


@_handles(commands.Basic.RecoverAsync)
def basic_recover_async(channel, method):
    channel.model.basic_recover(method.requeue)


# -- confirms and transactions


@_handles(commands.Confirm.Select)
def confirm_select(channel, method):
    channel.model.confirm_select()
    if not method.nowait:
        _reply(channel, commands.Confirm.SelectOk())


@_handles(commands.Tx.Select)
def tx_select(channel, method):
    channel.model.tx_select()
    _reply(channel, commands.Tx.SelectOk())


@_handles(commands.Tx.Commit)
def tx_commit(channel, method):
    # Answered once what the transaction stored is safe (at once if it stored nothing).
    channel.model.tx_commit().addBoth(_commit_outcome, channel)


def _commit_outcome(outcome, channel):
    if channel.closing or channel.model.closed:
        return  # the client closed the channel, or its connection went, meanwhile
    if isinstance(outcome, Failure):
        channel.close(outcome.value, frames.TX_COMMIT)
    else:
        _reply(channel, commands.Tx.CommitOk())


@_handles(commands.Tx.Rollback)
def tx_rollback(channel, method):
    channel.model.tx_rollback()
    _reply(channel, commands.Tx.RollbackOk())
