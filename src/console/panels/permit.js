/**
 * A permit's balance (GET /v1/permits/{id}): deposit, settled, charged but unsettled, reserved
 * and available, in the credit token's base units; below it, its receipts (recent requests and
 * spend over time, ./receipts.js). Refreshed while shown, and at once when a request's
 * settlement moves.
 */
import { segment } from "../api.js";
import { badge, code, credits, facts, h, hexIdForm, messageLine, time } from "../dom.js";
import { modelUnits } from "../units.js";
import { fetchReceipts, receiptsView } from "./receipts.js";

/** How often a shown balance is read again (ms). */
const refreshMs = 3000;

/** @type {import("../app.js").Panel} */
export const permitPanel = {
  id: "permit",
  title: "Permit balance",
  mount(section, { api, events }) {
    const { form, input } = hexIdForm({
      id: "permit-id",
      label: "Permit id",
      hint: "0x and 64 hex digits.",
      button: "Show balance",
    });
    const message = messageLine();
    const view = h("div", { class: "permit", "aria-live": "polite" });
    const receiptsMessage = messageLine();
    const receipts = h("div", { class: "permit-receipts" });
    section.append(form, message.element, view, receiptsMessage.element, receipts);
    /** What the receipts shown say (redrawn only when it changes: focus stays put). */
    let receiptsShown = "";

    /** @type {string | undefined} */
    let shown;
    /** The shown permit's model's token units (its amounts are written in them). */
    let units = {};
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;
    /** The latest load: only it schedules the next (a load the "ledger" event starts mid-way
     * would otherwise leave two refresh loops running). */
    let generation = 0;

    async function load() {
      clearTimeout(timer);
      const mine = ++generation;
      if (shown === undefined) return;
      if (!api.hasKey()) {
        view.replaceChildren();
        receipts.replaceChildren();
        receiptsShown = "";
        message.info("Enter an API key first.");
        return;
      }
      const id = shown;
      try {
        const permit = await api.get(`/v1/permits/${segment(id)}`);
        units = await modelUnits(api, permit.model_id);
        if (id !== shown) return;
        message.clear();
        view.replaceChildren(balanceView(permit, units));
      } catch (error) {
        if (id !== shown) return;
        view.replaceChildren();
        message.error(error);
      }
      try {
        const { receipts: list, complete } = await fetchReceipts(api, id);
        if (id !== shown) return;
        const state = JSON.stringify(list.map((r) => [r.receipt.message, r.settlement]));
        if (state !== receiptsShown) {
          receiptsShown = state;
          receipts.replaceChildren(h("h3", {}, "Receipts"), receiptsView(list, complete, units));
        }
        receiptsMessage.clear();
      } catch (error) {
        if (id !== shown) return;
        receiptsShown = "";
        receipts.replaceChildren();
        receiptsMessage.error(error);
      }
      if (id === shown && mine === generation) timer = setTimeout(load, refreshMs);
    }

    /** @param {string} id */
    function show(id) {
      shown = id.trim();
      units = {};
      input.value = shown;
      view.replaceChildren();
      receipts.replaceChildren();
      receiptsShown = "";
      message.info("Loading…");
      void load();
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      show(input.value);
    });
    events.addEventListener("show-permit", (event) => {
      show(/** @type {CustomEvent<string>} */ (event).detail);
      input.focus();
    });
    events.addEventListener("ledger", () => void load());
    events.addEventListener("key", () => void load());
  },
};

/**
 * @param {Record<string, any>} permit
 * @param {{ decimals?: number, symbol?: string }} units
 */
function balanceView(permit, units) {
  return h(
    "article",
    { class: "card", "data-permit-id": permit.permit_id },
    facts([
      ["State", badge(permit.state), "state"],
      ["Available", credits(permit.available, units), "available"],
      ["Deposit", credits(permit.deposit, units), "deposit"],
      ["Settled", credits(permit.settled, units), "settled"],
      ["Charged, not yet settled", credits(permit.charged_unsettled, units), "charged_unsettled"],
      ["Reserved for requests in flight", credits(permit.reserved, units), "reserved"],
      ["Permit id", code(permit.permit_id)],
      ["Model id", code(permit.model_id)],
      ["Offer", permit.offer_id === null ? "any offer of the model" : code(permit.offer_id)],
      ["Payer", code(permit.payer)],
      ["Expires", time(permit.expires_at)],
      ["Closable", time(permit.closable_at)],
    ]),
  );
}
