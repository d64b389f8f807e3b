// The list pages (queues, connections, channels, exchanges, bindings): a filter bar shared by
// all of them (a vhost from /api/vhosts, a name substring) and a sortable table each.

import { apiPath } from "./api.js";
import { el, replaceContent } from "./dom.js";
import { SortableTable } from "./table.js";

export class FilterBar {
  constructor(onChange) {
    this.vhost = "";
    this.text = "";
    this.select = el("select", { id: "filter-vhost", onchange: () => this.changed() }, el("option", { value: "" }, "All vhosts"));
    this.input = el("input", { id: "filter-name", type: "search", placeholder: "Filter by name", oninput: () => this.changed() });
    this.onChange = onChange;
    this.element = el("div", { class: "filters" }, el("label", {}, "Virtual host ", this.select), el("label", {}, "Name ", this.input));
  }

  changed() {
    this.vhost = this.select.value;
    this.text = this.input.value.trim().toLowerCase();
    this.onChange();
  }

  /** Offer the vhosts of /api/vhosts; a chosen vhost that has gone is let go. */
  setVhosts(vhosts) {
    const names = vhosts.map((vhost) => vhost.name);
    const current = Array.from(this.select.options, (option) => option.value).slice(1);
    if (JSON.stringify(names) !== JSON.stringify(current)) {
      replaceContent(this.select, el("option", { value: "" }, "All vhosts"), names.map((name) => el("option", { value: name }, name)));
    }
    if (!names.includes(this.vhost)) this.vhost = "";
    this.select.value = this.vhost;
  }
}

export class ListView {
  /**
   * kind: the API's collection (queues, connections, ...); listPath(vhost) its path for one
   * vhost (default api/KIND/VHOST); texts(row): the strings the name filter looks in; the rest
   * is the table's (see SortableTable).
   */
  constructor({ kind, title, filters, listPath, texts, ...table }) {
    this.kind = kind;
    this.filters = filters;
    this.listPath = listPath || ((vhost) => apiPath(kind, vhost));
    this.texts = texts || ((row) => [row.name]);
    this.table = new SortableTable({ id: `${kind}-table`, emptyText: `No ${kind}.`, ...table });
    this.count = el("p", { class: "count" });
    this.element = el("section", { id: `view-${kind}`, class: "view", hidden: true }, el("h1", {}, title), this.count, this.table.element);
  }

  /** Called when the page is shown: the filter bar moves under its title. */
  show() {
    this.count.before(this.filters.element);
  }

  async refresh(api) {
    const vhost = this.filters.vhost;
    const rows = (await api.get(vhost ? this.listPath(vhost) : apiPath(this.kind))) || [];
    if (vhost !== this.filters.vhost) return; // the answer of a vhost no longer chosen
    const text = this.filters.text;
    const shown = text ? rows.filter((row) => this.texts(row).some((value) => String(value ?? "").toLowerCase().includes(text))) : rows;
    const noun = rows.length === 1 ? this.kind.slice(0, -1) : this.kind; // queue, connection, ...
    this.count.textContent = shown.length === rows.length ? `${rows.length} ${noun}` : `${shown.length} of ${rows.length} ${noun}`;
    this.table.update(shown);
  }
}
