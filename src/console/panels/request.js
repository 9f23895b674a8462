/**
 * A request's record (GET /v1/requests/{id}, only the key that made it may read it): what was
 * asked, what was charged, and its settlement, followed until the settlement is final; from it,
 * its permit and its receipt (the receipt panel verifies it).
 */
import { segment } from "../api.js";
import { badge, code, credits, facts, h, time } from "../dom.js";
import { modelUnits } from "../units.js";
import { idLookup } from "../lookup.js";

/** How often an unfinished request is read again (ms): about the sandbox worker's pace. */
const pollMs = 2000;
/** Settlement states after which nothing changes any more. */
const finalSettlements = new Set(["settled", "none", "unsettleable"]);
const openStatuses = new Set(["pending", "streaming"]);

/** @type {import("../app.js").Panel} */
export const requestPanel = {
  id: "request",
  title: "Request",
  mount(section, { api, events }) {
    /** @type {string | undefined} */
    let lastSettlement;
    /** @type {ReturnType<typeof setTimeout> | undefined} */
    let timer;

    const lookup = idLookup(section, api, {
      form: {
        id: "request-id",
        label: "Request id",
        hint: "The X-Gateway-Request-Id header of a chat answer.",
        button: "Show request",
      },
      className: "request",
      read: async (id) => {
        const record = await api.get(`/v1/requests/${segment(id)}`);
        const units = await modelUnits(api, record.model);
        return () => {
          const settlement = record.settlement.status;
          if (lastSettlement !== undefined && settlement !== lastSettlement)
            events.dispatchEvent(new Event("ledger"));
          lastSettlement = settlement;
          view.replaceChildren(recordView(record, events, units));
          const final = finalSettlements.has(settlement) && !openStatuses.has(record.status);
          message.info(
            final ? `Settlement: ${settlement}.` : `Settlement: ${settlement}; following it…`,
          );
          if (!final) timer = setTimeout(load, pollMs);
        };
      },
    });
    const { form, input, message, view } = lookup;

    function load() {
      clearTimeout(timer);
      return lookup.load();
    }

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      lookup.select(input.value);
      lastSettlement = undefined;
      message.info("Loading…");
      void load();
    });
    events.addEventListener("key", () => void load());
  },
};

/**
 * A request's record as a card; with `actions`, the buttons that show its permit and its receipt
 * in the lookup panels (the requests table shows the receipt beside the record instead).
 * @param {Record<string, any>} record
 * @param {EventTarget} events
 * @param {{ decimals?: number, symbol?: string }} units the model's credit token's
 * @param {{ actions?: boolean }} [options]
 */
export function recordView(record, events, units, { actions = true } = {}) {
  const showPermit = h("button", { type: "button" }, "Show its permit");
  showPermit.addEventListener("click", () =>
    events.dispatchEvent(new CustomEvent("show-permit", { detail: record.permit_id })),
  );
  const showReceipt = h("button", { type: "button" }, "Verify its receipt");
  showReceipt.addEventListener("click", () =>
    events.dispatchEvent(new CustomEvent("show-receipt", { detail: record.id })),
  );
  const s = record.settlement;
  return h(
    "article",
    { class: "card", "data-request-id": record.id },
    facts([
      ["Status", badge(record.status), "status"],
      ["Model", record.model],
      ["Offer", code(record.offer_id)],
      ["Permit", code(record.permit_id)],
      ["Input tokens", record.input_tokens],
      ["Output tokens", record.output_tokens],
      [
        "Charged from",
        record.usage_source === null || record.usage_source === undefined
          ? undefined
          : record.usage_source === "provider"
            ? "the provider's claim"
            : "the gateway's count",
        "usage_source",
      ],
      ["Claimed by the provider", inOut(record.usage_claimed), "usage_claimed"],
      ["Counted by the gateway", inOut(record.usage_counted), "usage_counted"],
      ["Most it could cost", credits(record.maximum_credits, units), "maximum_credits"],
      ["Charged", credits(record.credits_charged, units), "credits_charged"],
      ["Billing", record.billing ?? "—"],
      ["Error", record.error ?? undefined],
      ["Created", time(record.created_at)],
      ["Completed", time(record.completed_at)],
    ]),
    h("h3", {}, "Settlement"),
    facts([
      ["Status", badge(s.status), "settlement_status"],
      ["Transaction", code(s.tx_hash), "tx_hash"],
      ["Batch", code(s.batch_id)],
      ["Settled", time(s.settled_at)],
      ["Reason", s.reason ?? undefined],
    ]),
    actions && h("div", { class: "buttons" }, showPermit, showReceipt),
  );
}

/**
 * A claim or a count as a reader says it ("12 in, 5 out"); absent (null) is not shown.
 * @param {Record<string, string> | null | undefined} figures
 */
function inOut(figures) {
  if (figures === null || figures === undefined) return undefined;
  return `${figures.input_tokens} in, ${figures.output_tokens} out`;
}
