/**
 * The frame of a panel that looks one id up (a request, its receipt, an offer's earnings): the
 * hex-id form, the message line and the view below them, and the one rule they share: a load
 * needs an API key, and an answer (or an error) that comes back after another id was asked for
 * is dropped.
 */
import { h, hexIdForm, messageLine } from "./dom.js";

/**
 * @param {HTMLElement} section the panel's section (form, message and view are appended to it)
 * @param {{ hasKey(): boolean }} api
 * @param {object} spec
 * @param {{ id: string, label: string, hint: string, button: string }} spec.form
 * @param {string} spec.className the view's class
 * @param {string} [spec.loading] the message shown while a load is under way
 * @param {(id: string) => Promise<() => void>} spec.read reads the id's answer; what it returns
 *   draws it, and is called only while the id is still the one shown
 */
export function idLookup(section, api, { form: formSpec, className, loading, read }) {
  const { form, input } = hexIdForm(formSpec);
  const message = messageLine();
  const view = h("div", { class: className });
  section.append(form, message.element, view);

  /** @type {string | undefined} */
  let shown;

  async function load() {
    if (shown === undefined) return;
    if (!api.hasKey()) {
      view.replaceChildren();
      message.info("Enter an API key first.");
      return;
    }
    const id = shown;
    if (loading !== undefined) message.info(loading);
    try {
      const draw = await read(id);
      if (id !== shown) return;
      draw();
    } catch (error) {
      if (id !== shown) return;
      view.replaceChildren();
      message.error(error);
    }
  }

  return {
    form,
    input,
    message,
    view,
    load,
    /**
     * Makes `id` (trimmed) the one shown and clears the view; the caller then loads it.
     * @param {string} id
     * @returns {string} the id, trimmed
     */
    select(id) {
      shown = id.trim();
      view.replaceChildren();
      return shown;
    },
  };
}
