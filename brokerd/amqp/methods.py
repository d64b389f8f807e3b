"""AMQP channel-level methods, each translated into one L{brokerd.channel.Channel} call.

Every handler takes the protocol, the L{ChannelState} and the method as pamqp
decoded it, calls the channel, and answers with the method's -ok unless the
client asked for nowait. Rules (names, equivalence, exclusivity, tags) live in
the channel and the model; a rule broken there raises the error sent back.
"""

from pamqp import commands

from brokerd.amqp import frames
from brokerd.amqp.peer import encoded_properties
from brokerd.errors import MethodNotImplemented

CHANNEL_METHODS = {}


def _handles(method_class):
    """Registers a handler for C{method_class} in L{CHANNEL_METHODS} by its method index."""

    def register(function):
        CHANNEL_METHODS[method_class.index] = function
        return function

    return register


def _reply(protocol, state, method):
    protocol.send(frames.method_frame(state.id, method))


# -- channel


@_handles(commands.Channel.Close)
def channel_close(protocol, state, method):
    protocol.close_channel_by_client(state)


@_handles(commands.Channel.CloseOk)
def channel_close_ok(protocol, state, method):
    pass  # only meaningful while we wait for it, which the protocol handles


@_handles(commands.Channel.Flow)
def channel_flow(protocol, state, method):
    _reply(protocol, state, commands.Channel.FlowOk(active=state.channel.flow(bool(method.active))))


@_handles(commands.Channel.FlowOk)
def channel_flow_ok(protocol, state, method):
    pass  # the broker never sends channel.flow, so there is nothing to confirm


# -- exchanges


@_handles(commands.Exchange.Declare)
def exchange_declare(protocol, state, method):
    state.channel.exchange_declare(
        method.exchange,
        method.exchange_type or "direct",
        method.passive,
        method.durable,
        method.auto_delete,
        method.internal,
        method.arguments or {},
    )
    if not method.nowait:
        _reply(protocol, state, commands.Exchange.DeclareOk())


@_handles(commands.Exchange.Delete)
def exchange_delete(protocol, state, method):
    state.channel.exchange_delete(method.exchange, method.if_unused)
    if not method.nowait:
        _reply(protocol, state, commands.Exchange.DeleteOk())


@_handles(commands.Exchange.Bind)
def exchange_bind(protocol, state, method):
    state.channel.exchange_bind(method.destination, method.source, method.routing_key, method.arguments or {})
    if not method.nowait:
        _reply(protocol, state, commands.Exchange.BindOk())


@_handles(commands.Exchange.Unbind)
def exchange_unbind(protocol, state, method):
    state.channel.exchange_unbind(method.destination, method.source, method.routing_key, method.arguments or {})
    if not method.nowait:
        _reply(protocol, state, commands.Exchange.UnbindOk())


# -- queues


@_handles(commands.Queue.Declare)
def queue_declare(protocol, state, method):
    name, message_count, consumer_count = state.channel.queue_declare(
        method.queue, method.passive, method.durable, method.exclusive, method.auto_delete, method.arguments or {}
    )
    if not method.nowait:
        protocol.send(frames.encode_declare_ok(state.id, name, message_count, consumer_count))


@_handles(commands.Queue.Bind)
def queue_bind(protocol, state, method):
    state.channel.queue_bind(method.queue, method.exchange, method.routing_key, method.arguments or {})
    if not method.nowait:
        _reply(protocol, state, commands.Queue.BindOk())


@_handles(commands.Queue.Unbind)
def queue_unbind(protocol, state, method):
    state.channel.queue_unbind(method.queue, method.exchange, method.routing_key, method.arguments or {})
    _reply(protocol, state, commands.Queue.UnbindOk())


@_handles(commands.Queue.Purge)
def queue_purge(protocol, state, method):
    count = state.channel.queue_purge(method.queue)
    if not method.nowait:
        _reply(protocol, state, commands.Queue.PurgeOk(message_count=count))


@_handles(commands.Queue.Delete)
def queue_delete(protocol, state, method):
    count = state.channel.queue_delete(method.queue, method.if_unused, method.if_empty)
    if not method.nowait:
        _reply(protocol, state, commands.Queue.DeleteOk(message_count=count))


# -- basic


@_handles(commands.Basic.Qos)
def basic_qos(protocol, state, method):
    if method.prefetch_size:
        raise MethodNotImplemented(f"prefetch_size={method.prefetch_size}")
    state.channel.basic_qos(method.prefetch_count, method.global_)
    _reply(protocol, state, commands.Basic.QosOk())


@_handles(commands.Basic.Consume)
def basic_consume(protocol, state, method):
    tag = state.channel.basic_consume(
        method.queue, method.consumer_tag, method.no_ack, method.exclusive, method.arguments or {}
    )
    if not method.nowait:
        protocol.send(frames.encode_consumer_tag_method(state.id, commands.Basic.ConsumeOk.index, tag))


@_handles(commands.Basic.Cancel)
def basic_cancel(protocol, state, method):
    state.channel.basic_cancel(method.consumer_tag)
    state.peer.forget_consumer(method.consumer_tag)
    if not method.nowait:
        protocol.send(frames.encode_consumer_tag_method(state.id, commands.Basic.CancelOk.index, method.consumer_tag))


@_handles(commands.Basic.CancelOk)
def basic_cancel_ok(protocol, state, method):
    pass  # a client may answer a broker-sent cancel; nothing is left to do


@_handles(commands.Basic.Get)
def basic_get(protocol, state, method):
    result = state.channel.basic_get(method.queue, method.no_ack)
    if result is None:
        _reply(protocol, state, commands.Basic.GetEmpty())
        return
    delivery_tag, redelivered, message, message_count = result
    content = frames.content_frames(state.id, encoded_properties(message), message.body, protocol.frame_max)
    protocol.send(
        frames.encode_get_ok(
            state.id, delivery_tag, redelivered, message.exchange, message.routing_key, message_count
        )
    )
    protocol.send_pieces(content, len(message.body))


@_handles(commands.Basic.Nack)
def basic_nack(protocol, state, method):
    state.channel.basic_nack(method.delivery_tag, method.multiple, method.requeue)


@_handles(commands.Basic.Reject)
def basic_reject(protocol, state, method):
    state.channel.basic_reject(method.delivery_tag, method.requeue)


@_handles(commands.Basic.Recover)
def basic_recover(protocol, state, method):
    state.channel.basic_recover(method.requeue)
    _reply(protocol, state, commands.Basic.RecoverOk())


@_handles(commands.Basic.RecoverAsync)
def basic_recover_async(protocol, state, method):
    state.channel.basic_recover(method.requeue)


# -- confirms and transactions


@_handles(commands.Confirm.Select)
def confirm_select(protocol, state, method):
    state.channel.confirm_select()
    if not method.nowait:
        _reply(protocol, state, commands.Confirm.SelectOk())


@_handles(commands.Tx.Select)
def tx_select(protocol, state, method):
    state.channel.tx_select()
    _reply(protocol, state, commands.Tx.SelectOk())


@_handles(commands.Tx.Commit)
def tx_commit(protocol, state, method):
    state.channel.tx_commit()
    _reply(protocol, state, commands.Tx.CommitOk())


@_handles(commands.Tx.Rollback)
def tx_rollback(protocol, state, method):
    state.channel.tx_rollback()
    _reply(protocol, state, commands.Tx.RollbackOk())
