// Admin > Limits: virtual host limits (max-connections, max-queues) and user limits
// (max-connections, max-channels), listed, set and cleared through /api/vhost-limits and
// /api/user-limits in RabbitMQ's shapes ({vhost or user, value: {limit: number}}). As in
// RabbitMQ's management UI, every management user sees the limits the API shows it (the vhosts
// it may use, every user's); the forms and Delete buttons are for administrators. A broker that
// does not serve limits (404) gets a message instead of the forms.

import { AdminPage, ConfirmBar, choice, field, setOptions } from "./admin.js";
import { apiPath } from "./api.js";
import { el, formatCount, replaceContent } from "./dom.js";
import { SortableTable } from "./table.js";

const KINDS = {
  vhost: { path: "vhost-limits", owner: "vhost", label: "Virtual host", limits: ["max-connections", "max-queues"] },
  user: { path: "user-limits", owner: "user", label: "User", limits: ["max-connections", "max-channels"] },
};

/**
 * One row per limit: [{ owner, name, value }] from RabbitMQ's [{vhost or user, value: {...}}],
 * an owner's limits by name as RabbitMQ's UI lists them.
 */
function rowsOf(answer, owner) {
  return (answer || []).flatMap((entry) =>
    Object.keys(entry.value || {})
      .sort()
      .map((name) => ({ owner: entry[owner], name, value: entry.value[name] })),
  );
}

export class LimitsView extends AdminPage {
  constructor(app) {
    super(app, "limits", "Limits");
    this.confirm = new ConfirmBar("limits-confirm");
    this.deleted = el("p", { id: "limits-result", class: "result", role: "status" });
    this.unavailable = el("p", { id: "limits-unavailable", class: "note", hidden: true });
    this.parts = {};
    const sections = Object.entries(KINDS).map(([kind, about]) => this.section(kind, about));
    this.body = el("div", {}, sections, this.confirm.element, this.deleted);
    replaceContent(this.content, this.unavailable, this.body);
  }

  section(kind, about) {
    const table = new SortableTable({
      id: `${kind}-limits-table`,
      emptyText: "No limits.",
      sortBy: "owner",
      rowData: (row) => ({ owner: row.owner, limit: row.name }),
      columns: [
        { id: "owner", label: about.label, value: (row) => row.owner },
        { id: "name", label: "Limit", value: (row) => row.name },
        { id: "value", label: "Value", numeric: true, value: (row) => row.value, cell: (row) => formatCount(row.value) },
        {
          id: "actions",
          label: "",
          value: () => "",
          cell: (row) =>
            this.app.isAdministrator() &&
            this.deleteButton(this.confirm, this.deleted, `Clear ${row.name} of ${row.owner}?`, (api) => api.delete(apiPath(about.path, row.owner, row.name)), `${row.name} of ${row.owner} cleared.`),
        },
      ],
    });
    const owner = el("select", { id: `${kind}-limit-owner` });
    const name = choice(`${kind}-limit-name`, "Limit", about.limits.map((limit) => [limit, limit]));
    const value = field(`${kind}-limit-value`, "Value (-1: no limit)", { type: "number", required: true });
    const result = el("p", { id: `${kind}-limit-result`, class: "result", role: "status" });
    const submit = (event) => {
      event.preventDefault();
      const [who, limit] = [owner.value, name.input.value];
      this.act(result, (api) => api.put(apiPath(about.path, who, limit), { value: Number(value.input.value) }), () => `${limit} of ${who} set.`);
    };
    const form = el("form", { id: `${kind}-limit-form`, class: "panel", onsubmit: submit }, el("h2", {}, `Set a ${about.label.toLowerCase()} limit`), el("label", {}, about.label, owner), name.label, value.label, el("button", { type: "submit" }, "Set limit"), result);
    const panels = el("div", { class: "panels" }, form);
    this.parts[kind] = { table, owner, panels };
    return el("div", {}, el("h2", {}, `${about.label} limits`), table.element, panels);
  }

  async load(api) {
    let answers;
    try {
      answers = await Promise.all([api.get(apiPath("vhost-limits")), api.get(apiPath("user-limits"))]);
    } catch (error) {
      if (error.status !== 404) throw error;
      this.unavailable.textContent = "This broker does not serve limits (/api/vhost-limits or /api/user-limits answered 404).";
      this.unavailable.hidden = false;
      this.body.hidden = true;
      return;
    }
    this.unavailable.hidden = true;
    this.body.hidden = false;
    const [vhostLimits, userLimits] = answers;
    this.parts.vhost.table.update(rowsOf(vhostLimits, "vhost"));
    this.parts.user.table.update(rowsOf(userLimits, "user"));
    const administrator = this.app.isAdministrator();
    for (const part of Object.values(this.parts)) part.panels.hidden = !administrator;
    if (!administrator) return;
    const [vhosts, users] = await Promise.all([api.get(apiPath("vhosts")), api.get(apiPath("users"))]);
    setOptions(this.parts.vhost.owner, (vhosts || []).map((vhost) => vhost.name));
    setOptions(this.parts.user.owner, (users || []).map((user) => user.name));
  }
}
