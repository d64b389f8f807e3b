// What the list pages show of each kind of object, in RabbitMQ's field names.

import { apiPath } from "./api.js";
import { el, exchangeLabel, formatBytes, formatCount, formatJson, formatRate, formatTime, queueHref, rateOf } from "./dom.js";
import { featuresCell, featuresText } from "./features.js";
import { ListView } from "./listview.js";

const count = (id, label, value) => ({
  id,
  label,
  numeric: true,
  value: (row) => value(row) ?? 0,
  cell: (row) => formatCount(value(row)),
});
const rate = (id, label, stat) => ({
  id,
  label,
  numeric: true,
  value: (row) => rateOf(row.message_stats, stat),
  cell: (row) => formatRate(rateOf(row.message_stats, stat)),
});
const text = (id, label, value) => ({ id, label, value: (row) => value(row) ?? "" });
const vhost = text("vhost", "Virtual host", (row) => row.vhost);

const features = { id: "features", label: "Features", value: featuresText, cell: featuresCell };

export function queuesView(filters) {
  return new ListView({
    kind: "queues",
    title: "Queues",
    filters,
    sortBy: "name",
    rowData: (row) => ({ vhost: row.vhost, name: row.name }),
    columns: [
      text("vhost", "Virtual host", (row) => row.vhost),
      { id: "name", label: "Name", value: (row) => row.name, cell: (row) => el("a", { href: queueHref(row.vhost, row.name) }, row.name) },
      text("type", "Type", (row) => row.type),
      features,
      text("state", "State", (row) => row.state),
      count("messages_ready", "Ready", (row) => row.messages_ready),
      count("messages_unacknowledged", "Unacked", (row) => row.messages_unacknowledged),
      count("messages", "Total", (row) => row.messages),
      count("consumers", "Consumers", (row) => row.consumers),
      rate("publish_rate", "Incoming", "publish"),
      rate("deliver_rate", "Deliver / get", "deliver_get"),
      rate("ack_rate", "Ack", "ack"),
    ],
  });
}

function client(row) {
  const properties = row.client_properties || {};
  return [properties.product, properties.version].filter((value) => typeof value === "string").join(" ");
}

/** A connection's name, and under it the name its client gave it (user_provided_name), as RabbitMQ's list shows them. */
const connectionName = {
  id: "name",
  label: "Name",
  value: (row) => row.name,
  cell: (row) => [row.name, row.user_provided_name != null && el("span", { class: "provided-name subtle" }, row.user_provided_name)],
};

export function connectionsView(filters) {
  return new ListView({
    kind: "connections",
    title: "Connections",
    filters,
    sortBy: "name",
    listPath: (name) => apiPath("vhosts", name, "connections"),
    texts: (row) => [row.name, row.user_provided_name ?? "", row.user, client(row)],
    rowData: (row) => ({ name: row.name }),
    columns: [
      vhost,
      connectionName,
      text("user", "User", (row) => row.user),
      text("protocol", "Protocol", (row) => row.protocol),
      text("client", "Client", client),
      count("channels", "Channels", (row) => row.channels),
      { id: "recv_oct", label: "Received", numeric: true, value: (row) => row.recv_oct ?? 0, cell: (row) => formatBytes(row.recv_oct) },
      { id: "send_oct", label: "Sent", numeric: true, value: (row) => row.send_oct ?? 0, cell: (row) => formatBytes(row.send_oct) },
      { id: "connected_at", label: "Connected", value: (row) => row.connected_at ?? 0, cell: (row) => formatTime(row.connected_at) },
    ],
  });
}

export function channelsView(filters) {
  const stat = (row, name) => (row.message_stats || {})[name];
  return new ListView({
    kind: "channels",
    title: "Channels",
    filters,
    sortBy: "name",
    listPath: (name) => apiPath("vhosts", name, "channels"),
    texts: (row) => [row.name, row.user],
    rowData: (row) => ({ name: row.name }),
    columns: [
      vhost,
      text("name", "Channel", (row) => row.name),
      text("user", "User", (row) => row.user),
      text("state", "State", (row) => row.state),
      count("consumer_count", "Consumers", (row) => row.consumer_count),
      count("prefetch_count", "Prefetch", (row) => row.prefetch_count),
      count("messages_unacknowledged", "Unacked", (row) => row.messages_unacknowledged),
      count("publish", "Published", (row) => stat(row, "publish")),
      count("deliver_get", "Delivered", (row) => stat(row, "deliver_get")),
      count("ack", "Acked", (row) => stat(row, "ack")),
    ],
  });
}

export function exchangesView(filters) {
  return new ListView({
    kind: "exchanges",
    title: "Exchanges",
    filters,
    sortBy: "name",
    texts: (row) => [exchangeLabel(row.name)],
    rowData: (row) => ({ vhost: row.vhost, name: row.name }),
    columns: [
      vhost,
      text("name", "Name", (row) => exchangeLabel(row.name)),
      text("type", "Type", (row) => row.type),
      features,
      text("arguments", "Arguments", (row) => formatJson(row.arguments)),
    ],
  });
}

export function bindingsView(filters) {
  return new ListView({
    kind: "bindings",
    title: "Bindings",
    filters,
    sortBy: "source",
    texts: (row) => [exchangeLabel(row.source), row.destination, row.routing_key],
    rowData: (row) => ({ vhost: row.vhost, source: row.source, destination: row.destination }),
    columns: [
      vhost,
      text("source", "Source", (row) => exchangeLabel(row.source)),
      text("destination_type", "Type", (row) => row.destination_type),
      {
        id: "destination",
        label: "Destination",
        value: (row) => row.destination,
        cell: (row) =>
          row.destination_type === "queue"
            ? el("a", { href: queueHref(row.vhost, row.destination) }, row.destination)
            : row.destination,
      },
      text("routing_key", "Routing key", (row) => row.routing_key),
      text("arguments", "Arguments", (row) => formatJson(row.arguments)),
    ],
  });
}
