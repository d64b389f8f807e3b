// Building the page from API data: every string goes in as text, never as markup.

/**
 * A new element: el("a", { href: "#/", class: "x" }, "text", child, ...).
 * Attributes named on... are event listeners; true sets a bare attribute; false, null
 * and undefined leave it out. Strings and numbers among the children become text nodes.
 */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (name.startsWith("on") && typeof value === "function") node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else if (value === true) node.setAttribute(name, "");
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace everything inside node with children. */
export function replaceContent(node, ...children) {
  node.replaceChildren();
  append(node, children);
}

const integer = new Intl.NumberFormat("en", { maximumFractionDigits: 0 });
const decimal = new Intl.NumberFormat("en", { minimumFractionDigits: 1, maximumFractionDigits: 1 });

/** A count with thousands separators; "" when the API gave none. */
export function formatCount(value) {
  return typeof value === "number" ? integer.format(value) : "";
}

/** A rate per second with one decimal, as RabbitMQ's UI shows it. */
export function formatRate(value) {
  return typeof value === "number" ? `${decimal.format(value)}/s` : "";
}

export function formatBytes(value) {
  if (typeof value !== "number") return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let size = value;
  let unit = 0;
  while (size >= 1024 && unit < units.length - 1) {
    size /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${size} B` : `${decimal.format(size)} ${units[unit]}`;
}

/** A millisecond timestamp as local time, with the date unless it is today. */
export function formatTime(milliseconds) {
  if (typeof milliseconds !== "number") return "";
  const time = new Date(milliseconds);
  return time.toDateString() === new Date().toDateString() ? time.toLocaleTimeString() : time.toLocaleString();
}

/** A rate from a message_stats object: stats.publish_details.rate and the like (0 when absent). */
export function rateOf(stats, name) {
  const details = stats && stats[`${name}_details`];
  return details && typeof details.rate === "number" ? details.rate : 0;
}

/** The name RabbitMQ's UI shows for the default exchange. */
export function exchangeLabel(name) {
  return name === "" ? "(AMQP default)" : name;
}

/** The page of one queue, with vhost and name URL-encoded ("/" is %2F). */
export function queueHref(vhost, name) {
  return `#/queues/${encodeURIComponent(vhost)}/${encodeURIComponent(name)}`;
}

/** A JSON value in one line, for arguments and properties. */
export function formatJson(value) {
  if (value === null || value === undefined) return "";
  if (typeof value === "object" && Object.keys(value).length === 0) return "";
  return JSON.stringify(value);
}
