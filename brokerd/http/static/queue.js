// The page of one queue: its figures, and forms to publish to it, get from it and purge it.

import { apiPath } from "./api.js";
import { el, formatBytes, formatCount, formatJson, formatRate, rateOf, replaceContent } from "./dom.js";
import { featuresText } from "./features.js";

const ACK_MODES = [
  ["ack_requeue_true", "Nack message requeue true"],
  ["reject_requeue_true", "Reject requeue true"],
  ["ack_requeue_false", "Automatic ack"],
  ["reject_requeue_false", "Reject requeue false"],
];
const ENCODINGS = [
  ["auto", "Auto string / base64"],
  ["base64", "base64"],
];

function options(choices) {
  return choices.map(([value, label]) => el("option", { value }, label));
}

/** A form's result line: done (text) or refused (the API's reason, marked as an error). */
function report(line, text, failed = false) {
  line.textContent = text;
  line.className = failed ? "result error" : "result";
}

export class QueueView {
  /** app: the dashboard, for its API client (app.api), refreshNow() and stillLoggedIn(error). */
  constructor(app) {
    this.app = app;
    this.vhost = null;
    this.name = null;
    this.title = el("h1");
    this.figures = el("dl", { class: "figures", id: "queue-figures" });

    this.payload = el("textarea", { id: "publish-payload", rows: 3 });
    this.publishResult = el("p", { id: "publish-result", class: "result", role: "status" });
    const publishForm = el(
      "form",
      { id: "publish-form", class: "panel", onsubmit: (event) => this.publish(event) },
      el("h2", {}, "Publish message"),
      el("label", {}, "Payload", this.payload),
      el("button", { type: "submit" }, "Publish message"),
      this.publishResult,
    );

    this.getCount = el("input", { id: "get-count", type: "number", min: 1, value: 1 });
    this.ackMode = el("select", { id: "get-ackmode" }, options(ACK_MODES));
    this.encoding = el("select", { id: "get-encoding" }, options(ENCODINGS));
    this.getResult = el("p", { id: "get-result", class: "result", role: "status" });
    this.messages = el("div", { id: "get-messages" });
    const getForm = el(
      "form",
      { id: "get-form", class: "panel", onsubmit: (event) => this.getMessages(event) },
      el("h2", {}, "Get messages"),
      el(
        "div",
        { class: "row" },
        el("label", {}, "Messages", this.getCount),
        el("label", {}, "Ack mode", this.ackMode),
        el("label", {}, "Encoding", this.encoding),
      ),
      el("button", { type: "submit" }, "Get messages"),
      this.getResult,
      this.messages,
    );

    this.purgeQuestion = el("span");
    this.purgeConfirm = el(
      "div",
      { id: "purge-confirm", class: "confirm", hidden: true },
      this.purgeQuestion,
      el("button", { type: "button", id: "purge-yes", class: "danger", onclick: () => this.purge() }, "Purge"),
      el("button", { type: "button", id: "purge-no", onclick: () => this.askPurge(false) }, "Cancel"),
    );
    this.purgeResult = el("p", { id: "purge-result", class: "result", role: "status" });
    const purgePanel = el(
      "div",
      { class: "panel" },
      el("h2", {}, "Purge"),
      el("button", { type: "button", id: "purge-button", class: "danger", onclick: () => this.askPurge(true) }, "Purge messages"),
      this.purgeConfirm,
      this.purgeResult,
    );

    this.missing = el("p", { class: "error", hidden: true });
    this.body = el("div", {}, this.figures, el("div", { class: "panels" }, publishForm, getForm, purgePanel));
    const back = el("p", {}, el("a", { href: "#/queues" }, "← Queues"));
    this.element = el("section", { id: "view-queue", class: "view", hidden: true }, back, this.title, this.missing, this.body);
  }

  /** Show the queue named name of vhost (decoded names); the forms start empty for another queue. */
  show(vhost, name) {
    if (vhost === this.vhost && name === this.name) return;
    this.vhost = vhost;
    this.name = name;
    this.queue = null;
    const where = el("span", { class: "subtle" }, ` in virtual host ${vhost}`);
    replaceContent(this.title, "Queue ", el("span", { id: "queue-name" }, name), where);
    replaceContent(this.figures);
    replaceContent(this.messages);
    for (const line of [this.publishResult, this.getResult, this.purgeResult]) report(line, "");
    this.payload.value = "";
    this.askPurge(false);
  }

  path(...more) {
    return apiPath("queues", this.vhost, this.name, ...more);
  }

  async refresh(api) {
    const { vhost, name } = this;
    let queue;
    try {
      queue = await api.get(this.path());
    } catch (error) {
      if (vhost !== this.vhost || name !== this.name) return; // another queue is shown now
      if (error.status !== 404) throw error;
      this.missing.textContent = `There is no queue ${this.name} in virtual host ${this.vhost}.`;
      this.missing.hidden = false;
      this.body.hidden = true;
      return;
    }
    if (vhost !== this.vhost || name !== this.name) return;
    this.missing.hidden = true;
    this.body.hidden = false;
    this.queue = queue;
    const stats = queue.message_stats || {};
    const figures = [
      ["state", "State", queue.state],
      ["messages_ready", "Ready", formatCount(queue.messages_ready)],
      ["messages_unacknowledged", "Unacked", formatCount(queue.messages_unacknowledged)],
      ["messages", "Total", formatCount(queue.messages)],
      ["consumers", "Consumers", formatCount(queue.consumers)],
      ["memory", "Ready bytes in memory", formatBytes(queue.memory)],
      ["publish_rate", "Incoming", formatRate(rateOf(stats, "publish"))],
      ["deliver_rate", "Deliver / get", formatRate(rateOf(stats, "deliver_get"))],
      ["ack_rate", "Ack", formatRate(rateOf(stats, "ack"))],
      ["type", "Type", queue.type],
      ["durable", "Durable", queue.durable ? "yes" : "no"],
      ["auto_delete", "Auto-delete", queue.auto_delete ? "yes" : "no"],
      ["arguments", "Arguments", formatJson(queue.arguments) || "none"],
      ["features", "Features", featuresText(queue)],
      ["policy", "Policy", queue.policy || "none"],
      ["effective_policy_definition", "Effective policy definition", formatJson(queue.effective_policy_definition) || "none"],
    ];
    replaceContent(
      this.figures,
      figures.map(([key, label, value]) =>
        el("div", { class: "figure", "data-figure": key }, el("dt", {}, label), el("dd", {}, value ?? "")),
      ),
    );
  }

  /** Run an API call for a form: its result line says what happened; the page refreshes after. */
  async act(line, call, done) {
    const api = this.app.api;
    try {
      report(line, done(await call(api)));
    } catch (error) {
      if (!(await this.app.stillLoggedIn(error))) return;
      report(line, error.reason || error.message, true); // a refused permission, in the broker's words
    }
    this.app.refreshNow();
  }

  publish(event) {
    event.preventDefault();
    const body = { routing_key: this.name, payload: this.payload.value, payload_encoding: "string", properties: {} };
    this.act(
      this.publishResult,
      (api) => api.post(apiPath("exchanges", this.vhost, "amq.default", "publish"), body),
      (answer) => (answer && answer.routed ? "Message published." : "Message published, but not routed."),
    );
  }

  getMessages(event) {
    event.preventDefault();
    const body = { count: Number(this.getCount.value) || 1, ackmode: this.ackMode.value, encoding: this.encoding.value };
    this.act(
      this.getResult,
      (api) => api.post(this.path("get"), body),
      (messages) => {
        replaceContent(this.messages, (messages || []).map((message, index) => this.messageBlock(message, index)));
        return messages && messages.length ? `${messages.length} message(s).` : "Queue is empty.";
      },
    );
  }

  messageBlock(message, index) {
    const rows = [
      ["Exchange", message.exchange === "" ? "(AMQP default)" : message.exchange],
      ["Routing key", message.routing_key],
      ["Redelivered", message.redelivered ? "yes" : "no"],
      ["Properties", formatJson(message.properties) || "none"],
      ["Payload", `${formatCount(message.payload_bytes)} bytes, encoding: ${message.payload_encoding}`],
    ];
    return el(
      "div",
      { class: "message" },
      el("h3", {}, `Message ${index + 1}`),
      el("p", { class: "subtle" }, `The server reported ${formatCount(message.message_count)} messages remaining.`),
      el("dl", { class: "message-fields" }, rows.map(([label, value]) => [el("dt", {}, label), el("dd", {}, value)])),
      el("pre", { class: "payload" }, message.payload),
    );
  }

  askPurge(asking) {
    if (asking) {
      const messages = this.queue ? formatCount(this.queue.messages_ready) : "all";
      this.purgeQuestion.textContent = `Remove the ${messages} ready message(s) of queue ${this.name}? `;
    }
    this.purgeConfirm.hidden = !asking;
  }

  purge() {
    this.askPurge(false);
    this.act(this.purgeResult, (api) => api.delete(this.path("contents")), () => "Queue purged.");
  }
}
