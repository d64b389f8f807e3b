// A table of API objects, sorted by the column whose header was clicked (again: the other way).

import { el, replaceContent } from "./dom.js";

const ROW_LIMIT = 500; // more rows than anyone reads; the filters narrow the rest

function compare(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a ?? "").localeCompare(String(b ?? ""), "en", { numeric: true });
}

export class SortableTable {
  /**
   * columns: [{ id, label, value(row) -> number or string to sort by, cell(row) -> text or node
   * (default: the value), numeric }]; rowData(row) -> data-* attributes of the row (for tests
   * and styles); sortBy: the id of the column sorted first.
   */
  constructor({ id, columns, rowData = () => ({}), sortBy, emptyText = "Nothing to show." }) {
    this.columns = columns;
    this.rowData = rowData;
    this.emptyText = emptyText;
    this.sort = { column: columns.find((column) => column.id === sortBy) || columns[0], descending: false };
    this.rows = [];
    this.head = el("thead");
    this.body = el("tbody");
    this.note = el("p", { class: "table-note" });
    this.element = el("div", { class: "table-wrap" }, el("table", { id, class: "data" }, this.head, this.body), this.note);
    this.renderHead();
  }

  renderHead() {
    this.headers = this.columns.map((column) =>
      el(
        "th",
        { class: column.numeric ? "numeric" : null, "data-column": column.id },
        el("button", { type: "button", onclick: () => this.sortOn(column) }, column.label),
      ),
    );
    replaceContent(this.head, el("tr", {}, this.headers));
    this.markSorted();
  }

  markSorted() {
    this.columns.forEach((column, index) => {
      const order = this.sort.descending ? "descending" : "ascending";
      this.headers[index].setAttribute("aria-sort", column === this.sort.column ? order : "none");
    });
  }

  sortOn(column) {
    if (this.sort.column === column) this.sort.descending = !this.sort.descending;
    else this.sort = { column, descending: Boolean(column.numeric) }; // biggest first for figures
    this.markSorted();
    this.update(this.rows);
  }

  /** Show rows (an array of API objects), sorted as the headers say. */
  update(rows) {
    this.rows = rows;
    const { column, descending } = this.sort;
    const sorted = rows.slice().sort((a, b) => {
      const order = compare(column.value(a), column.value(b));
      return descending ? -order : order;
    });
    const shown = sorted.slice(0, ROW_LIMIT);
    replaceContent(
      this.body,
      shown.map((row) => {
        const attributes = {};
        for (const [name, value] of Object.entries(this.rowData(row))) attributes[`data-${name}`] = value;
        return el(
          "tr",
          attributes,
          this.columns.map((col) =>
            el("td", { class: col.numeric ? "numeric" : null, "data-column": col.id }, (col.cell || col.value)(row)),
          ),
        );
      }),
    );
    if (rows.length === 0) this.note.textContent = this.emptyText;
    else if (rows.length > shown.length) {
      this.note.textContent = `The first ${shown.length} of ${rows.length}: narrow the filter to see the others.`;
    }
    else this.note.textContent = "";
  }
}
