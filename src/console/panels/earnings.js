/**
 * An offer's earnings (GET /v1/provider-offers/{id}/earnings): its charged requests, tokens and
 * credits by settlement state, why any are unsettleable, and the settlement batches that carry
 * them with their transactions. Only an API key the offer's operator bound to the offer
 * (`gateway provider bind-key`) may read them; the page uses the key pasted above.
 *
 * The settlement operator token, which also reads them (and every batch of the market), is not
 * asked for: it is the settlement's administrative credential, and a web page is no place for
 * it (docs/app-developers.md, "The market console").
 */
import { segment } from "../api.js";
import { badge, code, credits, facts, h, table, time } from "../dom.js";
import { idLookup } from "../lookup.js";
import { modelUnits } from "../units.js";

/** The states an offer's charges are counted in, in the order they move. */
const states = ["unsettled", "settling", "settled", "unsettleable"];

/** @type {import("../app.js").Panel} */
export const earningsPanel = {
  id: "earnings",
  title: "Offer earnings",
  mount(section, { api, events }) {
    const { form, input, message, view, load, select } = idLookup(section, api, {
      form: {
        id: "earnings-offer-id",
        label: "Offer id",
        hint: "The last 30 days. The API key must be bound to the offer by its operator (gateway provider bind-key).",
        button: "Show earnings",
      },
      className: "earnings",
      loading: "Loading…",
      read: async (id) => {
        const earnings = await api.get(`/v1/provider-offers/${segment(id)}/earnings`);
        const units = await modelUnits(api, earnings.model_id);
        return () => {
          message.clear();
          view.replaceChildren(earningsView(earnings, units));
        };
      },
    });

    form.addEventListener("submit", (event) => {
      event.preventDefault();
      select(input.value);
      void load();
    });
    events.addEventListener("key", () => void load());
    events.addEventListener("ledger", () => void load());
  },
};

/**
 * @param {Record<string, any>} e
 * @param {{ decimals?: number, symbol?: string }} units the offer's model's credit token's
 */
function earningsView(e, units) {
  return h(
    "article",
    { class: "card", "data-earnings-of": e.offer_id },
    facts([
      ["Offer", code(e.offer_id)],
      ["Payout address", code(e.payout)],
      ["From", time(e.from)],
      ["To", time(e.to)],
    ]),
    table(
      "Earnings by settlement state",
      ["State", "Requests", "Input tokens", "Output tokens", "Credits"],
      states.map((state) => [
        badge(state),
        String(e[state].requests),
        e[state].input_tokens,
        e[state].output_tokens,
        credits(e[state].credits, units),
      ]),
      states.map((state) => ({ "data-state": state })),
    ),
    e.unsettleable_reasons.length === 0
      ? h("p", { class: "muted" }, "No unsettleable charges.")
      : table(
          "Why charges are unsettleable",
          ["Reason", "Requests", "Credits"],
          e.unsettleable_reasons.map((r) => [
            r.reason,
            String(r.requests),
            credits(r.credits, units),
          ]),
        ),
    e.batches.length === 0
      ? h("p", { class: "muted" }, "No settlement batch carries the offer's charges yet.")
      : table(
          `Settlement batches (newest first${e.batches_truncated ? ", the most recent 100" : ""})`,
          ["Batch", "Status", "Requests", "Credits", "Transaction", "Created", "Settled"],
          e.batches.map((b) => [
            code(b.batch_id),
            badge(b.status),
            String(b.requests),
            credits(b.credits, units),
            // As text: the gateway knows no block explorer to link to.
            code(b.tx_hash),
            time(b.created_at),
            time(b.settled_at),
          ]),
          e.batches.map((b) => ({ "data-batch-id": b.batch_id })),
        ),
  );
}
