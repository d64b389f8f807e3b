// The Features column of queues and exchanges, as RabbitMQ's management UI writes it
// (formatters.js fmt_features_short and fmt_policy_short): a short mark per flag and known
// argument, each titled with what it stands for, "Args" for the other arguments, then the policy.

import { el } from "./dom.js";

// RabbitMQ's IMPLICIT_ARGS then KNOWN_ARGS (global.js), in its order: name -> short mark.
const MARKS = [
  ["durable", "D"],
  ["auto-delete", "AD"],
  ["internal", "I"],
  ["exclusive", "Excl"],
  ["messages delayed", "DM"],
  ["alternate-exchange", "AE"],
  ["x-message-ttl", "TTL"],
  ["x-expires", "Exp"],
  ["x-max-length", "Lim"],
  ["x-max-length-bytes", "Lim B"],
  ["x-delivery-limit", "DlL"],
  ["x-overflow", "Ovfl"],
  ["x-dead-letter-exchange", "DLX"],
  ["x-dead-letter-routing-key", "DLK"],
  ["x-queue-master-locator", "ML"],
  ["x-max-priority", "Pri"],
  ["x-single-active-consumer", "SAC"],
];
const KNOWN = new Set(MARKS.map(([name]) => name).slice(5));

/** An AMQP value in one line, as RabbitMQ's fmt_amqp_value_flat writes it. */
function flat(value) {
  if (Array.isArray(value)) return `[${value.map(flat).join(",")}]`;
  if (value !== null && typeof value === "object") return `(${flatTable(value)})`;
  return String(value);
}

function flatTable(table) {
  return Object.entries(table)
    .map(([name, value]) => `${name}: ${flat(value)}`)
    .join(", ");
}

/** The features of a queue or an exchange: { name: value } and the other arguments apart. */
export function featuresOf(row) {
  const found = {};
  const others = {};
  for (const [name, value] of Object.entries(row.arguments || {})) {
    if (!KNOWN.has(name)) others[name] = value;
    else if (value !== false) found[name] = value; // SAC false is no feature
  }
  if (row.exclusive) found.exclusive = true;
  if (row.durable) found.durable = true;
  if (row.auto_delete) found["auto-delete"] = true;
  if (row.internal) found.internal = true;
  if (row.messages_delayed !== undefined) found["messages delayed"] = row.messages_delayed;
  return { found, others };
}

/** The marks as text ("D TTL Lim Args policy"), to sort and filter by. */
export function featuresText(row) {
  const { found, others } = featuresOf(row);
  const marks = MARKS.filter(([name]) => name in found).map(([, mark]) => mark);
  if (Object.keys(others).length) marks.push("Args");
  if (row.policy) marks.push(row.policy);
  return marks.join(" ");
}

/** The marks as elements, each titled as RabbitMQ titles it ("x-message-ttl: 60000"). */
export function featuresCell(row) {
  const { found, others } = featuresOf(row);
  const marks = MARKS.filter(([name]) => name in found).map(([name, mark]) =>
    el("abbr", { title: `${name}: ${flat(found[name])}`, "data-feature": name }, mark),
  );
  if (Object.keys(others).length) marks.push(el("abbr", { title: flatTable(others), "data-feature": "arguments" }, "Args"));
  if (row.policy) marks.push(el("abbr", { class: "policy", title: `Policy: ${row.policy}`, "data-feature": "policy" }, row.policy));
  return el("span", { class: "features" }, marks.flatMap((mark, index) => (index ? [" ", mark] : [mark])));
}
