// The overview: queued messages and message rates over the last minutes, totals, the node's
// resources and their alarms, the nodes of its cluster (leader, in sync, lag), listeners.

import { apiPath } from "./api.js";
import { LineChart } from "./chart.js";
import { el, formatBytes, formatCount, formatRate, rateOf, replaceContent } from "./dom.js";

const RATES = [
  { key: "publish", label: "Published", color: "#d9822b" },
  { key: "deliver_get", label: "Delivered", color: "#2b7bd9" },
  { key: "ack", label: "Acknowledged", color: "#3a9a4a" }, // under deliveries, which it often equals
];
const QUEUED = [
  { key: "messages_ready", label: "Ready", color: "#d9b42b" },
  { key: "messages_unacknowledged", label: "Unacked", color: "#2b7bd9" },
  { key: "messages", label: "Total", color: "#9a4ad9" }, // under the others, which it often equals
];
const OBJECTS = [
  ["connections", "Connections"],
  ["channels", "Channels"],
  ["exchanges", "Exchanges"],
  ["queues", "Queues"],
  ["consumers", "Consumers"],
];

/** Tiles of figures: [[key, label]] read from an object, each tile marked data-total=key. */
function tiles(figures, source) {
  return figures.map(([key, label]) =>
    el(
      "div",
      { class: "tile", "data-total": key },
      el("span", { class: "tile-value" }, formatCount(source[key] ?? 0)),
      el("span", { class: "tile-label" }, label),
    ),
  );
}

/** A tile of one resource of the node, marked data-resource=key, and "alarm" while raised. */
function resourceTile(key, label, value, alarmed) {
  return el(
    "div",
    { class: alarmed ? "tile alarm" : "tile", "data-resource": key, "data-alarm": alarmed ? "raised" : "clear" },
    el("span", { class: "tile-value" }, value),
    el("span", { class: "tile-label" }, alarmed ? `${label}: alarm` : label),
  );
}

const yesNo = (value) => (value ? "yes" : "no");

/** One row of the cluster's nodes table, marked data-node, data-role, data-running, data-in-sync. */
function clusterNodeRow(node) {
  const role = node.leader ? "leader" : "follower";
  return el(
    "tr",
    { "data-node": node.name, "data-role": role, "data-running": String(node.running), "data-in-sync": String(node.in_sync) },
    el("td", {}, node.name),
    el("td", { "data-column": "role" }, role),
    el("td", { "data-column": "running", class: node.running ? null : "error" }, yesNo(node.running)),
    el("td", { "data-column": "in-sync" }, yesNo(node.in_sync)),
    el("td", { class: "numeric", "data-column": "lag-operations" }, formatCount(node.replication_lag_operations)),
    el("td", { class: "numeric", "data-column": "lag-bytes" }, formatBytes(node.replication_lag_bytes)),
  );
}

export class OverviewView {
  constructor() {
    this.rates = new LineChart({ id: "chart-rates", title: "Message rates", series: RATES, format: formatRate });
    this.queued = new LineChart({ id: "chart-queued", title: "Queued messages", series: QUEUED, format: formatCount, counts: true });
    this.previous = null; // { time, stats } of the sample before, for rates over the polling interval
    this.about = el("p", { class: "about" });
    this.queueTotals = el("div", { class: "tiles", id: "queue-totals" });
    this.objectTotals = el("div", { class: "tiles", id: "object-totals" });
    this.listeners = el("tbody");
    this.nodeTiles = el("div", { class: "tiles", id: "node-resources" });
    this.node = el("div", { hidden: true }, el("h2", {}, "Node"), this.nodeTiles);
    this.nodeName = null; // this node's name, from /api/overview
    this.clusterNodes = el("tbody");
    this.cluster = el(
      "div",
      { hidden: true, id: "cluster-nodes" },
      el("h2", {}, "Cluster nodes"),
      el(
        "table",
        { class: "data", id: "nodes-table" },
        el(
          "thead",
          {},
          el(
            "tr",
            {},
            ["Node", "Role", "Running", "In sync"].map((label) => el("th", {}, label)),
            el("th", { class: "numeric" }, "Lag (operations)"),
            el("th", { class: "numeric" }, "Lag (bytes)"),
          ),
        ),
        this.clusterNodes,
      ),
    );
    this.element = el(
      "section",
      { id: "view-overview", class: "view", hidden: true },
      el("h1", {}, "Overview"),
      this.about,
      el("div", { class: "charts" }, this.queued.element, this.rates.element),
      el("h2", {}, "Queue totals"),
      this.queueTotals,
      el("h2", {}, "Object totals"),
      this.objectTotals,
      this.node,
      this.cluster,
      el("h2", {}, "Listeners"),
      el(
        "table",
        { class: "data", id: "listeners-table" },
        el("thead", {}, el("tr", {}, el("th", {}, "Protocol"), el("th", {}, "Address"), el("th", { class: "numeric" }, "Port"))),
        this.listeners,
      ),
    );
  }

  /**
   * Take one answer of /api/overview: the charts get a point, the figures are shown. Rates are
   * the counters' change since the previous sample, per second (the API's own rate is the change
   * since whoever asked last, so other clients would shorten its interval); the first sample,
   * or one after the counters went back (a restarted broker), takes the API's rate.
   */
  sample(overview, time = Date.now() / 1000) {
    const stats = overview.message_stats || {};
    const rates = {};
    for (const { key } of RATES) {
      const count = stats[key];
      const before = this.previous && this.previous.stats[key];
      const interval = this.previous ? time - this.previous.time : 0;
      rates[key] = typeof count === "number" && typeof before === "number" && count >= before && interval > 0
        ? (count - before) / interval
        : rateOf(stats, key);
    }
    this.previous = { time, stats };
    this.rates.add(time, rates);
    this.queued.add(time, overview.queue_totals || {});
    this.showFigures(overview);
  }

  showFigures(overview) {
    this.nodeName = overview.node || null;
    replaceContent(this.about, `${overview.product_name || "brokerd"} ${overview.product_version || ""} on ${overview.node || ""}`);
    replaceContent(this.queueTotals, tiles(QUEUED.map(({ key, label }) => [key, label]), overview.queue_totals || {}));
    replaceContent(this.objectTotals, tiles(OBJECTS, overview.object_totals || {}));
    replaceContent(
      this.listeners,
      (overview.listeners || []).map((listener) =>
        el("tr", {}, el("td", {}, listener.protocol), el("td", {}, listener.ip_address), el("td", { class: "numeric" }, listener.port)),
      ),
    );
  }

  /** The node's resources and alarms, from /api/nodes (which needs the monitoring tag). */
  async refresh(api) {
    let nodes;
    try {
      nodes = await api.get(apiPath("nodes"));
    } catch (error) {
      if (error.status !== 401 && error.status !== 403) throw error;
      nodes = [];
    }
    nodes = nodes || [];
    this.showNode(nodes.find((node) => node.name === this.nodeName) || nodes[0]);
    this.showCluster(nodes);
  }

  /** The nodes of this node's cluster; hidden on a node on its own (its entry says nothing of a leader). */
  showCluster(nodes) {
    const clustered = nodes.some((node) => typeof node.leader === "boolean");
    this.cluster.hidden = !clustered;
    replaceContent(this.clusterNodes, clustered ? nodes.map(clusterNodeRow) : []);
  }

  showNode(node) {
    this.node.hidden = !node;
    if (!node) return;
    replaceContent(this.nodeTiles, [
      resourceTile("disk", "Disk free", formatBytes(node.disk_free), node.disk_free_alarm),
      resourceTile("disk-limit", "Disk free limit", formatBytes(node.disk_free_limit), false),
      resourceTile("memory", "Memory watermark", formatBytes(node.mem_limit), node.mem_alarm),
    ]);
  }

  /** Called when the view is shown: the charts are drawn at their new size. */
  redraw() {
    this.rates.draw();
    this.queued.draw();
  }
}
