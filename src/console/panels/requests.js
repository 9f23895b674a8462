/**
 * The key's recent requests (GET /v1/requests, newest first; "More" asks for the next page with
 * the cursor), each one click from its record (GET /v1/requests/{id}) and its signed receipt
 * (GET /v1/requests/{id}/receipt), verified here in the browser as the receipt panel does.
 */
import { segment } from "../api.js";
import { badge, code, credits, h, messageLine, time } from "../dom.js";
import { modelUnits } from "../units.js";
import { receiptView, verifyReceipt } from "./receipt.js";
import { recordView } from "./request.js";
import { short } from "./permits.js";

const pageSize = 10;

/** @type {import("../app.js").Panel} */
export const requestsPanel = {
  id: "requests",
  title: "Recent requests",
  mount(section, { api, events }) {
    const message = messageLine();
    const reload = h("button", { type: "button" }, "Refresh requests");
    const more = h("button", { type: "button", hidden: true }, "More requests");
    const body = h("tbody");
    const box = h(
      "div",
      { class: "table-box", role: "region", "aria-label": "Recent requests", tabindex: "0" },
      h(
        "table",
        {},
        h("caption", {}, "This key's requests, newest first"),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ...[
              "Request",
              "Created",
              "Model",
              "Status",
              "Tokens in / out",
              "Charged",
              "Settlement",
            ].map((c) => h("th", { scope: "col" }, c)),
          ),
        ),
        body,
      ),
    );
    const detailMessage = messageLine();
    const detail = h("div", { class: "request-detail", "aria-live": "polite" });
    section.append(
      h("div", { class: "buttons" }, reload),
      message.element,
      box,
      h("div", { class: "buttons" }, more),
      detailMessage.element,
      detail,
    );
    box.hidden = true;

    let generation = 0;
    /** The cursor: the last id shown. @type {string | undefined} */
    let last;
    /** The request whose detail is shown. @type {string | undefined} */
    let opened;

    /** @param {boolean} next append the next page (else start over) */
    async function load(next) {
      const mine = next ? generation : ++generation;
      if (!next) {
        body.replaceChildren();
        box.hidden = true;
        more.hidden = true;
        last = undefined;
      }
      if (!api.hasKey()) {
        detail.replaceChildren();
        detailMessage.clear();
        message.info("Enter an API key to see its requests.");
        return;
      }
      message.info("Loading requests…");
      try {
        const after = last === undefined ? "" : `&starting_after=${segment(last)}`;
        const page = await api.get(`/v1/requests?limit=${pageSize}${after}`);
        const rows = await Promise.all(
          page.data.map(async (r) => requestRow(r, await modelUnits(api, r.model), open)),
        );
        if (mine !== generation) return;
        body.append(...rows);
        last = page.data.at(-1)?.id ?? last;
        box.hidden = body.childElementCount === 0;
        more.hidden = !page.has_more;
        message.info(
          body.childElementCount === 0
            ? "No request yet: make one with this key (POST /v1/chat/completions)."
            : `${body.childElementCount} request${body.childElementCount === 1 ? "" : "s"} shown${page.has_more ? "; more follow" : ""}.`,
        );
      } catch (error) {
        if (mine === generation) message.error(error);
      }
    }

    /** Shows a request's record and its verified receipt below the table. @param {string} id */
    async function open(id) {
      opened = id;
      detail.replaceChildren();
      detailMessage.info("Loading the record and verifying its receipt…");
      try {
        const [record, gateway] = await Promise.all([
          api.get(`/v1/requests/${segment(id)}`),
          api.get("/v1/gateway"),
        ]);
        const units = await modelUnits(api, record.model);
        /** @type {Node} */
        let receipt;
        try {
          const signed = await api.get(`/v1/requests/${segment(id)}/receipt`);
          receipt = receiptView(id, signed, await verifyReceipt(signed, gateway, record), units);
        } catch (error) {
          // An open request, or one closed without a charge, has no receipt: say why.
          const e = /** @type {{ code?: string, message?: string }} */ (error);
          receipt = h("p", { class: "muted" }, `No receipt: ${e.code ?? "error"}: ${e.message}`);
        }
        if (opened !== id) return;
        detailMessage.clear();
        detail.replaceChildren(
          h("h3", { tabindex: "-1", "data-detail-of": id }, "Request ", code(id)),
          recordView(record, events, units, { actions: false }),
          h("h3", {}, "Its receipt"),
          receipt,
        );
        /** @type {HTMLElement} */ (detail.firstElementChild).focus();
      } catch (error) {
        if (opened === id) detailMessage.error(error);
      }
    }

    reload.addEventListener("click", () => void load(false));
    more.addEventListener("click", () => void load(true));
    events.addEventListener("key", () => {
      opened = undefined;
      detail.replaceChildren();
      detailMessage.clear();
      void load(false);
    });
    events.addEventListener("ledger", () => void load(false));
    message.info("Enter an API key to see its requests.");
  },
};

/**
 * A row of the table; its first cell's button opens the record and receipt.
 * @param {Record<string, any>} r
 * @param {{ decimals?: number, symbol?: string }} units
 * @param {(id: string) => void} open
 */
function requestRow(r, units, open) {
  // The name starts with the text shown (the short id), then says the rest to a screen reader.
  const button = h(
    "button",
    { type: "button", class: "link" },
    code(short(r.id)),
    // The id as code: an id, not an amount (the page's checks read amounts outside <code>).
    h(
      "span",
      { class: "visually-hidden" },
      ": request ",
      h("code", {}, r.id),
      ", show its record and receipt",
    ),
  );
  button.addEventListener("click", () => open(r.id));
  const cells = [
    button,
    time(r.created_at),
    r.model,
    badge(r.status),
    `${r.input_tokens} / ${r.output_tokens}`,
    credits(r.credits_charged, units),
    badge(r.settlement.status),
  ];
  return h(
    "tr",
    { "data-request-row": r.id, "data-settlement": r.settlement.status },
    ...cells.map((c) => h("td", {}, c)),
  );
}
