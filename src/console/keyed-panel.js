/**
 * The dashboard's panels read with the key alone (issue 38, item 4): each is a hint, a refresh
 * button, a status line and a view, loaded when a key is entered (and, for those showing money
 * moving, when a ledger changes); a load started later wins over one still answering.
 */
import { h, messageLine } from "./dom.js";

/**
 * @template T
 * @typedef {object} KeyedPanelSpec
 * @property {string} className the view's class
 * @property {string} hint what the panel shows
 * @property {string} refresh the refresh button's label
 * @property {string} noKey the status without a key
 * @property {string} loading the status while reading
 * @property {boolean} [onLedger] reload when a ledger changes (a chat, a settlement)
 * @property {() => Promise<T>} read what the panel shows, read with the key
 * @property {(value: T) => { info?: string, nodes: Node[] }} show the status and the view of it
 */

/**
 * Mounts a panel that reads with the key alone into `section`.
 * @template T
 * @param {HTMLElement} section
 * @param {{ api: import("./api.js").Api, events: EventTarget }} context
 * @param {KeyedPanelSpec<T>} spec
 */
export function mountKeyedPanel(section, { api, events }, spec) {
  const message = messageLine();
  const reload = h("button", { type: "button" }, spec.refresh);
  const view = h("div", { class: spec.className });
  section.append(
    h("p", { class: "hint" }, spec.hint),
    h("div", { class: "buttons" }, reload),
    message.element,
    view,
  );
  let generation = 0;

  async function load() {
    const mine = ++generation;
    view.replaceChildren();
    if (!api.hasKey()) {
      message.info(spec.noKey);
      return;
    }
    message.info(spec.loading);
    try {
      const value = await spec.read();
      if (mine !== generation) return;
      const { info, nodes } = spec.show(value);
      if (info === undefined) message.clear();
      else message.info(info);
      view.replaceChildren(...nodes);
    } catch (error) {
      if (mine === generation) message.error(error);
    }
  }

  reload.addEventListener("click", load);
  events.addEventListener("key", load);
  if (spec.onLedger === true) events.addEventListener("ledger", load);
  message.info(spec.noKey);
}
