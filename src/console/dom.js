/**
 * Building the DOM from data. Everything shown comes from the gateway, and much of it from
 * parties the reader does not control (an offer's region, hardware and capabilities are what its
 * provider wrote on chain): text is only ever set as text, never parsed as markup.
 */
import { amountText } from "./units.js";

/**
 * An element with attributes and children (strings become text nodes).
 * @param {string} tag
 * @param {Record<string, string | boolean | undefined>} [attributes]
 * @param {...(Node | string | null | undefined | false)} children
 * @returns {HTMLElement}
 */
export function h(tag, attributes = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === false) continue;
    element.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    element.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return element;
}

/**
 * A description list from `[term, value, field?]` rows; rows whose value is undefined are left
 * out. `field` names the row (`data-field`) for styling and scripts.
 * @param {[string, Node | string | undefined, string?][]} rows
 * @param {string} [className]
 */
export function facts(rows, className = "facts") {
  const list = h("dl", { class: className });
  for (const [term, value, field] of rows) {
    if (value === undefined) continue;
    list.append(h("div", { "data-field": field }, h("dt", {}, term), h("dd", {}, value)));
  }
  return list;
}

/**
 * An amount for a person: in the credit token's units with its symbol when `units` has the
 * token's decimals (src/console/units.js), else in base units, digits grouped. The exact base
 * units, to copy, are the tooltip and `data[value]`.
 * @param {string | null | undefined} value base units, a decimal string
 * @param {{ decimals?: number, symbol?: string }} [units]
 */
export function credits(value, units = {}) {
  if (value === null || value === undefined) return h("span", { class: "muted" }, "—");
  return h(
    "data",
    { value, class: "amount", title: `${value} base units` },
    amountText(value, units),
  );
}

/** A Unix time (seconds) as a `<time>`; null as a dash. @param {number | null | undefined} seconds */
export function time(seconds) {
  if (seconds === null || seconds === undefined) return h("span", { class: "muted" }, "—");
  const date = new Date(seconds * 1000);
  const iso = date.toISOString();
  return h("time", { datetime: iso }, iso.replace("T", " ").replace(/\.\d+Z$/, " UTC"));
}

/** A hash, address or id in full (wrapping on narrow screens). @param {string | null | undefined} value */
export function code(value) {
  if (value === null || value === undefined || value === "")
    return h("span", { class: "muted" }, "—");
  return h("code", { class: "hex" }, value);
}

/** A status word as a badge; `data-status` carries the word for styling and scripts. @param {string} status */
export function badge(status) {
  return h("span", { class: "badge", "data-status": status }, status);
}

/**
 * A panel's one-field form for a Hex32 id (a permit, a request, an offer): the labelled input
 * with its hint, and the submit button. The input's pattern accepts surrounding spaces, as a
 * pasted id often has them.
 * @param {{ id: string, label: string, hint: string, button: string }} spec
 * @returns {{ form: HTMLFormElement, input: HTMLInputElement }}
 */
export function hexIdForm({ id, label, hint, button }) {
  const input = /** @type {HTMLInputElement} */ (
    h("input", {
      id,
      type: "text",
      autocomplete: "off",
      spellcheck: "false",
      placeholder: "0x…",
      pattern: "^\\s*0x[0-9a-fA-F]{64}\\s*$",
      required: true,
      "aria-describedby": `${id}-hint`,
    })
  );
  const form = /** @type {HTMLFormElement} */ (
    h(
      "form",
      { class: "inline-form" },
      h("label", { for: id }, label),
      input,
      h("p", { id: `${id}-hint`, class: "hint" }, hint),
      h("div", { class: "buttons" }, h("button", { type: "submit" }, button)),
    )
  );
  return { form, input };
}

/** The message line of a panel: shown for errors and progress, announced to screen readers. */
export function messageLine() {
  const line = h("p", { class: "status", role: "status" });
  return {
    element: line,
    /** @param {string} text */
    info(text) {
      line.dataset.kind = "info";
      line.textContent = text;
    },
    /** @param {unknown} error */
    error(error) {
      line.dataset.kind = "error";
      const e = /** @type {{ code?: string, message?: string }} */ (error);
      line.textContent =
        e.code === undefined ? String(e.message ?? error) : `${e.code}: ${e.message}`;
    },
    clear() {
      delete line.dataset.kind;
      line.textContent = "";
    },
  };
}

const svgNs = "http://www.w3.org/2000/svg";

/**
 * An SVG element, built as the DOM's (no markup parsed). Presentation goes through attributes and
 * the stylesheet's classes: the console's CSP refuses inline style.
 * @param {string} tag
 * @param {Record<string, string | number>} [attributes]
 * @param {...(Node | string)} children
 * @returns {SVGElement}
 */
export function svg(tag, attributes = {}, ...children) {
  const element = /** @type {SVGElement} */ (document.createElementNS(svgNs, tag));
  for (const [name, value] of Object.entries(attributes)) element.setAttribute(name, String(value));
  for (const child of children)
    element.append(typeof child === "string" ? document.createTextNode(child) : child);
  return element;
}

/**
 * A table with a caption and column headers; each row's cells are nodes or text. Wrapped in a
 * box that scrolls sideways on a narrow screen rather than widening the page.
 * @param {string} caption
 * @param {string[]} columns
 * @param {(Node | string)[][]} rows
 * @param {Record<string, string>[]} [rowAttributes] attributes of each row (e.g. `data-request-id`)
 */
export function table(caption, columns, rows, rowAttributes = []) {
  // Focusable and named: a box that scrolls must be reachable by keyboard.
  return h(
    "div",
    { class: "table-box", role: "region", "aria-label": caption, tabindex: "0" },
    h(
      "table",
      {},
      h("caption", {}, caption),
      h("thead", {}, h("tr", {}, ...columns.map((c) => h("th", { scope: "col" }, c)))),
      h(
        "tbody",
        {},
        ...rows.map((cells, i) =>
          h("tr", rowAttributes[i] ?? {}, ...cells.map((c) => h("td", {}, c))),
        ),
      ),
    ),
  );
}
